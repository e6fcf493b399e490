"""Recording and reading cancels: :func:`cancel`, :func:`record_cancels`, :func:`cancelled_ids`.

The cancel log itself (and the index each cancel checks) is :mod:`celery_delayq.index`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence


from .. import signals
from ..glue.app_ladder import index_of, ladder_for
from ..index.cancel_log import read_cancel_book, record
from ..index.ids import Resolved, TaskIdNotFound, resolve_ids
from ..index.lookup import find_waiting
from ..index.query import PendingTask, iso, read_index
from ..index.stream import IndexUnavailable, reader_connection
from ..inputs import check_id
from ..ladder.index_layout import MARGIN_S
from ..typing import CeleryApp
from .revoke import tell_workers

__all__ = ["cancel", "CancelResult", "cancelled_ids", "record_cancels"]


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


def cancel(app: CeleryApp, *task_ids: str, lookup: bool = True, force: bool = False,
           only_waiting: bool = False) -> list[CancelResult]:
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
        only_waiting: Every id must be the whole id of a task waiting now and not
            cancelled yet (the web page's and the API's rule; no prefixes, no ``force``).

    Raises:
        BadInput: an id is not one (empty, unprintable, not UTF-8, too long; nothing was recorded).
        TaskIdNotFound: an id names no waiting task (nothing was recorded); ``force`` records it.
        AmbiguousTaskId: a prefix starts several waiting ids (nothing was recorded).
        TaskNotWaiting: with ``only_waiting``, an id names no task waiting now (nothing was recorded).
        IndexUnavailable: there is no index to check the ids in; ``force`` records them unchecked.
        PublishError: naming the ids whose cancel may not be recorded.
    """
    ids = list(dict.fromkeys(check_id(str(t), what="task id") for t in task_ids))
    if not ids:
        return []
    now = time.time()
    if not lookup:
        return _record(app, [(i, i, None) for i in ids], "cancelled", now)
    connection, layout = index_of(app)
    book = functools.cache(lambda: read_cancel_book(connection, layout, now=now))  # one read of the log, if any
    if only_waiting:  # one read of the index and of the log, then the cancels
        waiting = find_waiting(connection, layout, ids, now=now, book=book)
        return _record(app, [(i, i, waiting[i]) for i in ids], "cancelled", now)
    try:
        resolved = resolve_ids(connection, layout, ids, now=now, book=book)
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
            found = {k: v for k, v in read_index(*index_of(app), task_ids=ids, now=now).items() if v.due > now}
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
    connection, layout = index_of(app)
    with reader_connection(connection) as raw:
        record(raw, layout, [(r.task_id, r.until, reason) for r in results.values()],
               timeout=ladder.config.confirm_timeout,
               dues={r.task_id: r.found.due for r in results.values() if r.found is not None})
    if reason != "revoked":  # a revoke is Celery's own broadcast, sent by the caller right after this
        tell_workers(app, [(r.task_id, r.found.due if r.found else None) for r in results.values()],
                     timeout=ladder.config.confirm_timeout, now=now)
    for r in results.values():
        p = r.found
        signals.message_cancelled.send(sender=app, task_id=r.task_id, task_name=p.task_name if p else "",
                                       queue=(p.queue or p.routing_key) if p else "",
                                       attempt=p.attempt if p else 0, reason="requested")
    return list(results.values())


def cancelled_ids(app: CeleryApp, *, now: float | None = None) -> set[str]:
    """Every task id whose cancel holds at ``now``, read from the app's cancel log."""
    return read_cancel_book(*index_of(app), now=now).live(now)
