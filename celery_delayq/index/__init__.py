"""The index of waiting tasks and the cancel log (the streams beside each ladder): read, and the log written.

Every reader takes a kombu connection and an :class:`~celery_delayq.ladder.index_layout.IndexLayout`
(the names, pure), never the app: callers above the glue resolve them. Imports: the ground, ``ladder/``,
``config``, ``rabbitmq/``; never the glue or a feature. ``amqp``: :mod:`.stream` only. The modules, one line
each: docs/how-it-works.md (the layout table and "The index of waiting tasks").
"""

from __future__ import annotations

from .cancel_book import CancelBook
from .ids import AmbiguousTaskId, TaskIdError, TaskIdNotFound, resolve_ids
from .cancel_log import read_cancel_book
from .lookup import TaskNotWaiting, find_waiting
from .query import PendingTask, read_index
from .stream import IndexUnavailable

__all__ = ["PendingTask", "IndexUnavailable", "read_index", "TaskIdError", "TaskIdNotFound", "AmbiguousTaskId",
           "resolve_ids", "TaskNotWaiting", "find_waiting", "read_cancel_book", "CancelBook"]
