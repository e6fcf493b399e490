"""Bad ``countdown``/``eta`` on any task of an app with the ladder: ``InvalidDelay``, nothing sent.

Celery fails on a bad countdown with whatever its arithmetic raises, and sends a junk eta string unchecked.
:class:`CheckedTaskMessage` takes the app's ``app.amqp.create_task_message`` seam: for tasks whose delays belong
in the ladder, a delay that is not a point in time raises :class:`~celery_delayq.InvalidDelay` and one beyond
``delayq_max_delay`` :class:`~celery_delayq.DelayTooLong`, before a message exists; an epoch-seconds eta becomes
a datetime, and a countdown the eta Celery would write (the app's time zone), from the clock reading the check
used (Celery would read its clock and convert again). Other apps and tasks keep Celery's behaviour.
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
        self._build: Callable[..., Any] | None = None

    def __call__(self, task_id: Any, name: Any, args: Any = None, kwargs: Any = None,
                 countdown: Any = None, eta: Any = None, *rest: Any, **options: Any) -> Any:
        if (countdown is not None or eta is not None) and self.routing.wants({"task": name}):
            now = self.clock()
            countdown, eta, due = checked_delay(countdown, eta, now=now)
            if due is not None and due > now:  # before Celery's before_task_publish even fires
                self.routing.config.check_delay(due - now)
            if countdown and due is not None:
                # Celery's own conversion (its clock read again, the app's time zone, every call), done once
                # from the clock reading the check used: the same instant, in the same zone, as the message's eta.
                eta, countdown = datetime.fromtimestamp(due, tz=self.amqp.app.timezone), None
        build = self._build
        if build is None:  # chosen once, as Celery's own ``create_task_message`` (a cached property) does
            build = self._build = self.amqp.task_protocols[self.amqp.app.conf.task_protocol]
        return build(task_id, name, args, kwargs, countdown, eta, *rest, **options)
