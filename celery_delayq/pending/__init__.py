"""See the delayed work waiting in the ladder: ``celery_delayq.pending(app, ...)``.

* :mod:`.layout`: the index and cancel-log streams (names, bindings; pure).
* :mod:`.frames`: the few header fields the index needs, read from raw AMQP frames (pure).
* :mod:`.stream`: reading a stream to its end, fast, without changing it.
* :mod:`.query`: reading the index (:func:`read_index`).
* :mod:`.ids`: full ids and unique prefixes, resolved against the index (``pending --id``, ``cancel``).
* :mod:`.listing`: :func:`pending` itself: the index, less the cancelled tasks.
"""

from __future__ import annotations

from .ids import AmbiguousTaskId, TaskIdError, TaskIdNotFound, resolve_ids
from ..ladder.index_layout import IndexLayout, index_layout
from .listing import pending
from .query import IndexUnavailable, PendingTask, read_index

__all__ = ["pending", "PendingTask", "IndexUnavailable", "IndexLayout", "index_layout", "read_index",
           "TaskIdError", "TaskIdNotFound", "AmbiguousTaskId", "resolve_ids"]
