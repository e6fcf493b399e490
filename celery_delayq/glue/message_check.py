"""Bad ``countdown``/``eta`` on any task of an app with the ladder: ``InvalidDelay``, nothing sent.

Celery turns a countdown into an eta when it builds the task message
(``app.amqp.create_task_message``, which every ``apply_async``, ``send_task``,
``retry`` and canvas publish goes through), and fails there with whatever the
arithmetic raises: ``TypeError`` for ``countdown="soon"``, ``ValueError`` for
NaN, ``OverflowError`` for infinity or a huge negative number,
``AttributeError`` for an eta that is a number. A junk eta *string* it does
not check at all: the message is sent, and the worker fails on it later.

:func:`celery_delayq.install` puts :class:`CheckedTaskMessage` in that one
seam of the app (``app.amqp.create_task_message``, an attribute Celery
computes once per app from ``task_protocols``, as ``app.amqp.Producer`` is
for the producer). For the tasks whose delays belong in the ladder (every
task with ``delayq_enabled``, the ``DelayedRetryTask`` tasks without), a
countdown or eta that is not a point in time raises
:class:`~celery_delayq.InvalidDelay`, and one beyond ``delayq_max_delay``
:class:`~celery_delayq.DelayTooLong`, as ``DelayedRetryTask`` always did,
before a message exists. An eta given as epoch seconds is accepted and
passed on as a datetime. Other apps and other tasks keep Celery's behaviour.

Not covered: when Celery's own native delayed delivery is active (quorum
task queues behind a topic exchange), ``send_task`` reads the countdown
before it builds the message, and a non-number fails there first, still
before anything is sent.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from ..ladder.delays import check_countdown, parse_eta
from ..errors import InvalidDelay

if TYPE_CHECKING:  # pragma: no cover - only named: the app ladder passes itself
    from .app_ladder import AppLadder

__all__ = ["CheckedTaskMessage", "checked_delay"]


def checked_delay(countdown: Any, eta: Any, *, now: float) -> tuple[float | None, Any, float | None]:
    """``(countdown, eta, due)``, checked: eta as Celery accepts it, due as epoch seconds or None.

    Raises:
        InvalidDelay: a countdown or eta that is not a usable point in time.
    """
    due = None
    if countdown is not None:
        countdown = check_countdown(countdown)
        due = now + countdown
    if eta is not None:
        when = parse_eta(eta)
        if isinstance(eta, (int, float)):  # epoch seconds: Celery needs a datetime
            try:
                eta = datetime.fromtimestamp(when, tz=timezone.utc)
            except (OverflowError, OSError, ValueError):
                raise InvalidDelay(f"eta {eta!r} is not a representable point in time") from None
        if due is None:  # Celery: a countdown given with an eta wins
            due = when
    return countdown, eta, due


class CheckedTaskMessage:
    """``app.amqp.create_task_message`` that checks the delay of ladder tasks first."""

    def __init__(self, amqp: Any, routing: AppLadder, *, clock: Callable[[], float] = time.time) -> None:
        self.amqp = amqp
        self.routing = routing
        self.clock = clock

    def __call__(self, task_id: Any, name: Any, args: Any = None, kwargs: Any = None,
                 countdown: Any = None, eta: Any = None, *rest: Any, **options: Any) -> Any:
        if (countdown is not None or eta is not None) and self.routing.wants({"task": name}):
            now = self.clock()
            countdown, eta, due = checked_delay(countdown, eta, now=now)
            if due is not None and due > now:
                # DelayTooLong before a message exists, so not even Celery's before_task_publish
                # fires; every other delayed publish is checked by the scheduler (celery_delayq.scheduling).
                self.routing.config.check_delay(due - now)
        build = self.amqp.task_protocols[self.amqp.app.conf.task_protocol]
        return build(task_id, name, args, kwargs, countdown, eta, *rest, **options)
