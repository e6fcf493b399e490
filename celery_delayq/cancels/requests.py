"""Recording and reading cancels: :func:`cancel`, :func:`record_cancels`, :func:`cancelled_ids`."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .. import signals
from ..glue.app_ladder import ladder_for
from ..inputs import check_id
from ..pending.ids import Resolved, TaskIdNotFound, resolve_ids
from ..ladder.index_layout import MARGIN_S
from ..pending.query import IndexUnavailable, PendingTask, iso, open_layout, read_index
from ..pending.stream import reader_connection
from .book import CancelBook
from .log import load, record
from ..typing import CeleryApp

__all__ = ["cancel", "CancelResult", "cancelled_ids", "cancel_book", "record_cancels"]


@dataclass(frozen=True)
class CancelResult:
    """One recorded cancel.

    Attributes:
        task_id: The task id.
        until: Epoch seconds until which the cancel holds.
        found: The waiting pass found in the index (``None``: the task is not
            waiting in the ladder now; it is dropped if it arrives before ``until``).
        given: What the caller gave: the id, or the start of it that named ``task_id``.
    """

    task_id: str
    until: float
    found: PendingTask | None = None
    given: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``delayq cancel --json``."""
        return {"task_id": self.task_id, "given": self.given or self.task_id, "until": iso(self.until),
                "waiting": self.found is not None, "task": self.found.task_name if self.found else None,
                "due": self.found.due_iso if self.found else None}


def cancel(app: CeleryApp, *task_ids: str, lookup: bool = True, force: bool = False) -> list[CancelResult]:
    """Cancel waiting tasks by id: they will not run, however long they still wait.

    Each id must be the id of a task waiting in the ladder, or the start of
    exactly one such id (as ``delayq pending`` lists them); it is checked in
    the index and nothing is recorded unless every id names a waiting task.
    Returns once the cancels are confirmed by the broker, one
    :class:`CancelResult` per task (its ``given`` is what named it); each
    holds until its task's due time plus a day, however far away that is.

    Args:
        app: The Celery app.
        task_ids: Full ids or unique prefixes.
        lookup: ``False`` skips the index (no check, no prefixes): every id is
            recorded as given, holding for the ladder's maximum delay plus a day.
        force: Also record the ids that name no waiting task, as given (a task
            not published yet), holding for the ladder's maximum delay plus a day.

    Raises:
        BadInput: an id is not one (empty, unprintable, not UTF-8, too long; nothing was recorded).
        TaskIdNotFound: an id names no waiting task (nothing was recorded); ``force`` records it.
        AmbiguousTaskId: a prefix starts several waiting ids (nothing was recorded).
        IndexUnavailable: there is no index to check the ids in; ``force`` records them unchecked.
        PublishError: naming the ids whose cancel may not be recorded.
    """
    ids = list(dict.fromkeys(check_id(str(t), what="task id") for t in task_ids))
    if not ids:
        return []
    if not lookup:
        return _record(app, [(i, i, None) for i in ids], "cancelled", time.time())
    ladder = ladder_for(app)
    now = time.time()
    book = functools.cache(lambda: cancel_book(app, now=now))  # one read of the cancel log, if any
    try:
        resolved = resolve_ids(ladder, ids, now=now, cancelled=lambda: book().live(now),
                               superseded=lambda: book().live_passes(now))
    except IndexUnavailable as exc:
        if not force:
            raise IndexUnavailable(f"{exc} Without it a cancel cannot check the ids: pass force=True "
                                   "(`delayq cancel --force`) to record them unchecked.") from None
        resolved = Resolved({}, ids, "no index")
    if resolved.unknown and not force:
        raise TaskIdNotFound(resolved.unknown, resolved.looked_at, moved=resolved.moved)
    items = [(resolved.found[g].task_id, g, resolved.found[g]) if g in resolved.found else (g, g, None) for g in ids]
    return _record(app, items, "cancelled", now)


def record_cancels(app: CeleryApp, task_ids: Iterable[str], *, lookup: bool = False,
                   reason: str = "cancelled") -> list[CancelResult]:
    """Record cancels of full ``task_ids`` as given, whether or not they are waiting (Celery's revoke).

    With ``lookup``, a waiting task's cancel holds until its due time plus a
    day; otherwise each holds for the ladder's maximum delay plus a day.
    """
    ids = list(dict.fromkeys(str(t) for t in task_ids))
    if not ids:
        return []
    ladder = ladder_for(app)
    now = time.time()
    found: dict[str, PendingTask] = {}
    if lookup and ladder.config.index:
        try:
            found = {k: v for k, v in read_index(ladder, task_ids=ids, now=now).items() if v.due > now}
        except IndexUnavailable:  # not declared yet: record as given, for the longest delay
            found = {}
    return _record(app, [(i, i, found.get(i)) for i in ids], reason, now)


def _record(app: CeleryApp, items: Sequence[tuple[str, str, PendingTask | None]], reason: str,
            now: float) -> list[CancelResult]:
    """Record ``(task_id, given, found)`` cancels (one per task id), confirmed, and signal them."""
    ladder = ladder_for(app)
    longest = now + ladder.config.spec.max_delay_s + MARGIN_S
    results: dict[str, CancelResult] = {}
    for task_id, given, found in items:
        if task_id not in results:  # two prefixes of one id: one cancel
            results[task_id] = CancelResult(task_id, found.due + MARGIN_S if found else longest, found, given)
    with reader_connection(ladder) as raw:
        layout = open_layout(ladder, raw)
        record(raw, layout, [(r.task_id, r.until, reason) for r in results.values()],
               timeout=ladder.config.confirm_timeout,
               dues={r.task_id: r.found.due for r in results.values() if r.found is not None})
    for r in results.values():
        p = r.found
        signals.message_cancelled.send(sender=app, task_id=r.task_id, task_name=p.task_name if p else "",
                                       queue=(p.queue or p.routing_key) if p else "",
                                       attempt=p.attempt if p else 0, reason="requested")
    return list(results.values())


def cancelled_ids(app: CeleryApp, *, now: float | None = None) -> set[str]:
    """Every task id whose cancel holds at ``now``, read from the app's cancel log."""
    return cancel_book(app, now=now).live(now)


def cancel_book(app: CeleryApp, *, now: float | None = None) -> CancelBook:
    """The app's cancel log, read whole into a :class:`CancelBook` (``delayq status`` counts from it).

    Raises:
        IndexUnavailable: the broker has no streams (before RabbitMQ 3.9).
    """
    ladder = ladder_for(app)
    book = CancelBook()
    with reader_connection(ladder) as raw:
        layout = open_layout(ladder, raw)
        load(raw, layout, book, now=now)
    return book
