"""``celery_delayq.pending(app, ...)``: the tasks waiting in the index, less those cancelled.

It reads the index and the cancel log (:mod:`celery_delayq.index`) and leaves out what
:func:`~celery_delayq.index.ids.hidden` hides. :func:`read_pending` is the same read from a connection and a
layout alone, so the web page's reader process (which has only those) reads exactly what ``pending`` does.
"""

from __future__ import annotations

import fnmatch
import functools
import time
from datetime import datetime, timezone

from typing import TYPE_CHECKING

from ..glue.app_ladder import index_of
from ..index.ids import hidden, resolve_ids
from ..index.cancel_log import read_cancel_book
from ..index.query import PendingTask, read_index
from ..ladder.index_layout import IndexLayout
from ..typing import CeleryApp

if TYPE_CHECKING:  # pragma: no cover
    import kombu

__all__ = ["pending", "read_pending"]


def pending(app: CeleryApp, *, task: str | None = None, queue: str | None = None, task_id: str | None = None,
            due_before: float | datetime | None = None, due_after: float | datetime | None = None,
            now: float | None = None) -> list[PendingTask]:
    """Every delayed task or retry waiting in ``app``'s ladder, soonest due first.

    Args:
        app: The Celery app (its ``delayq_*`` settings name the ladder).
        task: Only task names matching this glob (``proj.tasks.*``).
        queue: Only tasks for this queue (or, when the queue is not known, this routing key).
        task_id: Only this task: its id (reads one index shard: the fast lookup) or the
            start of exactly one waiting id (reads every shard), as ``cancel`` takes it.
        due_before: Only tasks due before this time (epoch seconds or an aware datetime).
        due_after: Only tasks due at or after this time.
        now: The time "waiting" is judged at (default: now).

    Raises:
        IndexUnavailable: the ladder has no index (off, broker before 3.9, not declared).
        AmbiguousTaskId: ``task_id`` is the start of several waiting ids (they are listed).
    """
    connection, layout = index_of(app)
    return read_pending(connection, layout, task=task, queue=queue, task_id=task_id, due_before=due_before,
                        due_after=due_after, now=now)


def read_pending(connection: kombu.Connection, layout: IndexLayout, *, task: str | None = None,
                 queue: str | None = None, task_id: str | None = None, due_before: float | datetime | None = None,
                 due_after: float | datetime | None = None, now: float | None = None) -> list[PendingTask]:
    """:func:`pending` from the ladder's connection and index layout (``index_of(app)``) instead of the app.

    The arguments after ``layout`` and the exceptions are :func:`pending`'s.
    """
    now = time.time() if now is None else now
    # One read of the cancel log, shared by the lookup and the filter
    book = functools.cache(lambda: read_cancel_book(connection, layout, now=now))
    if task_id is not None:
        waiting = list(resolve_ids(connection, layout, [task_id], now=now, book=book).found.values())
    else:
        waiting = [t for t in read_index(connection, layout, now=now).values() if t.due > now]
    if waiting:
        waiting = [t for t in waiting if not hidden(t, book(), now)]
    before, after = _epoch(due_before), _epoch(due_after)
    out = [t for t in waiting if _matches(t, task, queue, before, after)]
    out.sort(key=lambda t: (t.due, t.task_id))
    return out


def _matches(t: PendingTask, task: str | None, queue: str | None, before: float | None,
             after: float | None) -> bool:
    if task is not None and not fnmatch.fnmatchcase(t.task_name or "", task):
        return False
    if queue is not None and (t.queue if t.queue is not None else t.routing_key) != queue:
        return False
    if before is not None and not t.due < before:
        return False
    return after is None or t.due >= after


def _epoch(value: float | datetime | None) -> float | None:
    if value is None or isinstance(value, (int, float)):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()
