"""Is this task waiting? :func:`find_waiting` reads the index shards of whole ids once, the cancel log once.

Used by a run-now, a reschedule and an API cancel; :func:`waiting_with_passes`, the same judgement for one id
with every pass of it, by the web page's task detail (its shard and the log on one connection). The log's read,
:func:`read_cancel_book`, lives with the log (:mod:`.cancel_log`) and is named here too.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import DelayqError
from ..ladder.index_layout import IndexLayout
from .cancel_book import CancelBook
from .cancel_log import cancel_book_on, read_cancel_book
from .ids import resolve_ids, superseded
from .query import PendingTask, passes_on
from .stream import reader_connection

if TYPE_CHECKING:  # pragma: no cover
    import kombu

__all__ = ["TaskNotWaiting", "find_waiting", "waiting_with_passes", "read_cancel_book"]


class TaskNotWaiting(DelayqError):
    """No waiting task has this id (never scheduled, already due, or cancelled)."""


def find_waiting(connection: kombu.Connection, layout: IndexLayout, task_ids: Sequence[str], *, now: float,
                 book: Callable[[], CancelBook] | None = None) -> dict[str, PendingTask]:
    """The waiting pass of each whole id in ``task_ids``, or :class:`TaskNotWaiting` for the first that is not.

    ``book``: the cancel log, if the caller already has it (else it is read once, when needed).
    """
    book = book or functools.cache(lambda: read_cancel_book(connection, layout, now=now))
    resolved = resolve_ids(connection, layout, task_ids, now=now, book=book, prefixes=False)
    for task_id in task_ids:
        _judge(task_id, resolved.found.get(task_id), task_id in resolved.moved, book, now)
    return resolved.found


def waiting_with_passes(connection: kombu.Connection, layout: IndexLayout, task_id: str, *,
                        now: float) -> tuple[PendingTask, list[PendingTask]]:
    """The waiting pass of the whole id ``task_id`` (as :func:`find_waiting` judges it) and every pass of it
    the index still holds, oldest first (:func:`~.query.read_passes`), or :class:`TaskNotWaiting`.

    One connection: the id's shard is read once (its last pass is the latest), then the cancel log
    (only when a pass is found). :func:`find_waiting` and :func:`~.query.read_passes` one after the
    other open five connections and read the shard twice.
    """
    with reader_connection(connection) as raw:
        passes = passes_on(raw, layout, task_id, now)
        latest = passes[-1] if passes and passes[-1].due > now else None
        book = functools.cache(lambda: cancel_book_on(raw, layout, now=now))
        moved = latest is not None and superseded(latest, book(), now)
        return _judge(task_id, None if moved else latest, moved, book, now), passes


def _judge(task_id: str, found: PendingTask | None, moved: bool, book: Callable[[], CancelBook],
           now: float) -> PendingTask:
    """``found`` (the id's latest pass not yet due, not superseded) if it waits, else :class:`TaskNotWaiting`."""
    if not moved and (found is None or found.task_name is None):
        raise TaskNotWaiting(f"no task {task_id!r} is waiting in the ladder (unknown, already due, or not a "
                             "Celery task); `delayq pending --id` lists what waits")
    if book().cancelled(task_id, now):
        raise TaskNotWaiting(f"task {task_id!r} was cancelled; it will not run")
    if moved or found is None:  # None only when moved, by the first test
        raise TaskNotWaiting(f"task {task_id!r} was run now or moved: the copy in the ladder is cancelled "
                             "(a moved task's new due time is listed once its index entry is written)")
    return found
