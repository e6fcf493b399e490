"""Run a waiting task now, or move it to a new due time, so that it runs once: :func:`reschedule`.

A TTL queue's message cannot be moved, so the task is published again (same id) and the old copy is cancelled
by its *pass* (``x-delayq-entry``), which the new copy does not share: new copy first, pass cancel second, so a
crash between may run it twice, never lose it. Arguments that cannot be rebuilt from the index entry are
:class:`CannotReschedule`. docs/cancel.md.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Sequence

import kombu

from ..config import DelayqConfig
from ..errors import DelayqError, PublishError
from ..glue.app_ladder import index_of, ladder_for
from ..glue.integration import install
from ..index.cancel_log import record_passes
from ..index.lookup import find_waiting
from ..index.query import PendingTask, iso
from ..index.stream import reader_connection
from ..inputs import parse_due
from ..rabbitmq.client import attempts
from ..ladder.index_layout import MARGIN_S
from ..index.writer import ARGS_CUT
from ..typing import CeleryApp
from .revoke import tell_workers

__all__ = ["CannotReschedule", "Rescheduled", "cancel_passes", "reschedule", "reschedule_many", "arguments_of"]

log = logging.getLogger(__name__)


class CannotReschedule(DelayqError):
    """The task cannot be published again from what the index knows (it is left as it was)."""


@dataclass(frozen=True)
class Rescheduled:
    """One task moved: the copy that was waiting and the new due time (``None``: run now)."""

    old: PendingTask
    due: float | None

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the API's and ``--json``'s)."""
        return {"task_id": self.old.task_id, "task": self.old.task_name, "was_due": self.old.due_iso,
                "due": iso(self.due) if self.due is not None else None, "run_now": self.due is None}


def cancel_passes(app: CeleryApp, passes: Sequence[PendingTask], *, reason: str = "superseded") -> None:
    """Record in the cancel log that these ladder passes (not their task ids) must not run.

    Returns once the broker confirmed every entry.

    Raises:
        CannotReschedule: a pass has no entry id (listed by an old version).
        PublishError: naming the passes whose cancel may not be recorded.
    """
    if not passes:
        return
    missing = [p.task_id for p in passes if not p.entry]
    if missing:
        raise CannotReschedule(f"no ladder pass id for {', '.join(missing)} in the index (listed by an older "
                               "celery_delayq); cancel it with `delayq cancel` and publish it again yourself")
    connection, layout = index_of(app)
    timeout = ladder_for(app).config.confirm_timeout
    with reader_connection(connection) as raw:
        record_passes(raw, layout, [(p.task_id, p.entry, p.due + MARGIN_S) for p in passes if p.entry],
                      reason=reason, timeout=timeout)
    tell_workers(app, [(p.entry, p.due) for p in passes if p.entry], timeout=timeout)


def _literal(text: str | None, kind: type, task: PendingTask) -> Any:
    if text is None:
        raise CannotReschedule(f"task {task.task_id}: its arguments are not in the index (published by an "
                               "older celery_delayq or not a Celery task); it was left as it is")
    if text.endswith(ARGS_CUT) or text.endswith("..."):
        raise CannotReschedule(f"task {task.task_id}: its arguments are too long to be rebuilt from the index "
                               "(cut); it was left as it is. Cancel it and publish it again yourself.")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise CannotReschedule(f"task {task.task_id}: its arguments {text[:80]!r} are not Python literals, so "
                               "they cannot be rebuilt from the index; it was left as it is") from None
    if kind is tuple and isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, kind):
        raise CannotReschedule(f"task {task.task_id}: unexpected argument text {text[:80]!r}; left as it is")
    return value


def arguments_of(task: PendingTask) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The task's arguments rebuilt from its index entry, or :class:`CannotReschedule` (a bulk move checks
    every task with it before it moves any)."""
    return _literal(task.argsrepr, tuple, task), _literal(task.kwargsrepr, dict, task)


@contextlib.contextmanager
def _confirmed_sender(app: CeleryApp) -> Iterator[Callable[[PendingTask, Any, Any, dict[str, Any]], None]]:
    """One connection with publisher confirms that publishes run-now copies straight to their destination.

    A plain ``send_task`` is confirmed only where the app sets ``confirm_publish``: during a partition
    the broker could drop the new copy while the cancel of the old one was confirmed, and the task was
    lost (the chaos soak found two). Nothing changes for a task whose copy raises: its old copy still waits.

    Raises (from the function it gives):
        PublishError: the broker did not confirm the copy (named by its task id).
    """
    timeout = DelayqConfig.from_app(app).confirm_timeout
    with app.connection_for_write(transport_options={"confirm_publish": True}) as conn:

        def send(found: PendingTask, args: Any, kwargs: Any, options: dict[str, Any]) -> None:
            try:
                conn.ensure_connection(max_retries=attempts(conn, 0) - 1)  # every failover host once, as reads do
                app.send_task(found.task_name, args, kwargs, producer=kombu.Producer(conn), retry=False,
                              timeout=timeout, confirm_timeout=timeout, **options)
            except Exception as exc:  # noqa: BLE001 - whatever it was, the copy may not be on the broker
                raise PublishError(
                    f"the copy of task {found.task_id} that would run now was not confirmed by the broker "
                    f"({type(exc).__name__}: {exc}); nothing was changed: it still waits, due {found.due_iso}",
                    failed=[found.task_id]) from exc

        yield send


def _options(found: PendingTask, when: float | None) -> dict[str, Any]:
    """``send_task`` options that give the copy the task's id, attempt, destination and (moved) due time."""
    options: dict[str, Any] = {"task_id": found.task_id, "retries": found.attempt}
    if found.queue and not found.exchange:
        options["queue"] = found.queue
    else:
        options.update(exchange=found.exchange, routing_key=found.routing_key)
    if when is not None:
        options["eta"] = datetime.fromtimestamp(when, tz=timezone.utc)
    return options


def _when(app: CeleryApp, due: float | datetime | None, now: float) -> float | None:
    if due is None:
        return None
    return parse_due(due.timestamp() if isinstance(due, datetime) else due, now=now,
                     check_delay=DelayqConfig.from_app(app).check_delay)


def reschedule(app: CeleryApp, task_id: str, *, due: float | datetime | None, now: float | None = None,
               found: PendingTask | None = None) -> Rescheduled:
    """Move the waiting task ``task_id`` to ``due`` (epoch seconds or aware datetime; ``None``: run it now).

    The task keeps its id, name, destination, attempt and arguments; it runs once
    (see the module docstring for the order and its one window). A moved copy is
    published through the ladder (installed here if it is not) whether or not this
    process has ``delayq_enabled`` or has bound the task, as its first copy was.

    ``found``: its waiting pass, when the caller has just read it.

    Raises:
        TaskNotWaiting: ``task_id`` is not waiting in the ladder (unknown, due, or cancelled).
        CannotReschedule: its arguments cannot be rebuilt from the index.
        IndexUnavailable: the ladder has no index.
        BadInput: ``due`` is not in the future (a past due time never means "now": pass ``None``).
        DelayTooLong: ``due`` is later than the app accepts.
        PublishError: the new copy, or the cancel of the old one, was not confirmed (the message says which).
    """
    now = time.time() if now is None else now
    when = _when(app, due, now)
    found = found or find_waiting(*index_of(app), [task_id], now=now)[task_id]
    return _move(app, [found], when)[0]


def reschedule_many(app: CeleryApp, tasks: Sequence[PendingTask], *, due: float | datetime | None,
                    now: float | None = None) -> list[Rescheduled]:
    """Move waiting tasks (as :func:`reschedule` moves one) with one connection and one cancel of their old passes.

    Every task's arguments are checked before anything is published. The new copies go out first (each
    confirmed), then the passes they replace are cancelled in one confirmed write and one broadcast. When a
    copy is refused, the passes of the copies already out are still cancelled (those tasks moved) and the
    :class:`PublishError` names the task that did not move; the tasks after it were not touched.

    Raises:
        CannotReschedule: a task's arguments cannot be rebuilt from the index (nothing was moved).
        BadInput, DelayTooLong: as :func:`reschedule`.
        PublishError: a copy or the cancel of the old passes was not confirmed (the message says which).
    """
    return _move(app, tasks, _when(app, due, time.time() if now is None else now))


def _move(app: CeleryApp, tasks: Sequence[PendingTask], when: float | None) -> list[Rescheduled]:
    """:func:`reschedule_many` once the new due time (``None``: now) is checked."""
    arguments = [arguments_of(t) for t in tasks]
    moved: list[PendingTask] = []
    try:
        if when is None:
            with _confirmed_sender(app) as send:
                for found, (args, kwargs) in zip(tasks, arguments):
                    send(found, args, kwargs, _options(found, None))
                    moved.append(found)
        else:  # the ladder's publish is confirmed (and mandatory)
            # The copy waited in the ladder, so the moved one waits there too, whatever this process knows of
            # the task: `delayq web` and the CLI load the app but never bind its DelayedRetryTask tasks, and
            # without delayq_enabled such a copy went to the task queue as a plain ETA (held by a worker).
            install(app).tasks.update(t.task_name or "" for t in tasks)
            for found, (args, kwargs) in zip(tasks, arguments):
                app.send_task(found.task_name, args, kwargs, **_options(found, when))
                moved.append(found)
    finally:
        cancel_passes(app, moved)  # the copies that went out replace their old passes, even when a later one failed
    for found in moved:
        log.info("delayq: task %s[%s] (due %s) %s", found.task_name, found.task_id, found.due_iso,
                 "run now" if when is None else f"rescheduled to {iso(when)}")
    return [Rescheduled(found, when) for found in moved]
