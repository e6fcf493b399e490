"""The index of waiting tasks and the cancel log (the streams beside each ladder): read, and the log written.

* :mod:`.frames` (pure), :mod:`.stream`: read a stream to its end fast; append to one; the readers' connection;
* :mod:`.query`: :func:`read_index`; :mod:`.ids`: ids and prefixes, and what "waiting" leaves out;
* :mod:`.cancel_book` (pure), :mod:`.cancel_log`: the cancels, in memory and in their stream;
* :mod:`.lookup`: is this task waiting? (:func:`find_waiting`: the index and the log read once);
* :mod:`.priority` (pure): a lookup goes first; a read of the whole index pauses meanwhile.

Every reader takes a kombu connection and an :class:`~celery_delayq.ladder.index_layout.IndexLayout`
(the names, pure), never the app: callers above the glue resolve them. Imports: the ground, ``ladder/``,
``config``, ``rabbitmq/``; never the glue or a feature. ``amqp``: :mod:`.stream` only.
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
