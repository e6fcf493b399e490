"""The index of waiting tasks and the cancel log: the streams beside each ladder, read (and the log written).

* :mod:`.frames`: the few header fields the index needs, read from raw AMQP frames (pure);
* :mod:`.stream`: reading a stream to its end, fast, without changing it; appending to one, confirmed;
  the connection every read uses (:class:`IndexUnavailable` when the broker has no streams);
* :mod:`.query`: reading the index (:func:`read_index`: the latest pass of every task id);
* :mod:`.ids`: full ids and unique prefixes resolved against the index; what "waiting" leaves out
  (:func:`~.ids.superseded`, :func:`~.ids.hidden`);
* :mod:`.cancel_book`: the cancels known, in memory (pure); :mod:`.cancel_log`: the cancel log's
  entries, written and read;
* :mod:`.lookup`: is this task waiting? (:func:`find_waiting`), the index and the log read once.

The stream names are :mod:`celery_delayq.ladder.index_layout` (pure); the index's entries are
written when the broker confirms a ladder publish (the index writer). Every reader takes a kombu
connection (a template: each read opens its own copy) and an :class:`~celery_delayq.ladder.index_layout.IndexLayout`,
never the app: a caller above the glue (``pending/``, ``cancels/``, the CLI, the web page) resolves
them from its app. Import rule: ``index/`` imports the ground, ``ladder/``, ``config`` and
``rabbitmq/`` only; never the glue, a feature or the CLI. ``amqp`` is imported by :mod:`.stream` alone.
"""

from __future__ import annotations

from .cancel_book import CancelBook
from .ids import AmbiguousTaskId, TaskIdError, TaskIdNotFound, resolve_ids
from .lookup import TaskNotWaiting, find_waiting, read_cancel_book
from .query import PendingTask, read_index
from .stream import IndexUnavailable

__all__ = ["PendingTask", "IndexUnavailable", "read_index", "TaskIdError", "TaskIdNotFound", "AmbiguousTaskId",
           "resolve_ids", "TaskNotWaiting", "find_waiting", "read_cancel_book", "CancelBook"]
