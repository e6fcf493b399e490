"""Is this task waiting? :func:`find_waiting` reads the index shards of whole ids once, the cancel log once.

Used by a run-now, a reschedule, an API cancel and the API's one task. The log's read,
:func:`read_cancel_book`, lives with the log (:mod:`.cancel_log`) and is named here too.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import DelayqError
from ..ladder.index_layout import IndexLayout
from .cancel_book import CancelBook
from .cancel_log import read_cancel_book
from .ids import resolve_ids
from .query import PendingTask

if TYPE_CHECKING:  # pragma: no cover
    import kombu

__all__ = ["TaskNotWaiting", "find_waiting", "read_cancel_book"]


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
        found = resolved.found.get(task_id)
        moved = task_id in resolved.moved
        if not moved and (found is None or found.task_name is None):
            raise TaskNotWaiting(f"no task {task_id!r} is waiting in the ladder (unknown, already due, or not a "
                                 "Celery task); `delayq pending --id` lists what waits")
        if book().cancelled(task_id, now):
            raise TaskNotWaiting(f"task {task_id!r} was cancelled; it will not run")
        if moved:
            raise TaskNotWaiting(f"task {task_id!r} was run now or moved: the copy in the ladder is cancelled "
                                 "(a moved task's new due time is listed once its index entry is written)")
    return resolved.found
