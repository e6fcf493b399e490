"""Parking queues: where a DelayedRetryTask's message goes when its retries are exhausted.

* :class:`ParkingQueue` — list, inspect (:meth:`~ParkingQueue.get`), replay, purge and
  :meth:`~ParkingQueue.redeclare` (drop a delivery limit, see :mod:`.limits`).
* :class:`ParkedMessage`, :class:`ParkedFilter` — a parked message's metadata, and filters.
* :class:`Parker` — the confirmed publish that parks a message (DelayedRetryTask uses it).
* CLI: ``celery -A proj delayq parking list|inspect|replay|purge``.
"""

from __future__ import annotations

from .errors import ParkedMessageNotFound, ParkingError, ParkingFailed, UnsafeToBrowse
from .park import Parker, failure_headers, parker_for, parking_message
from .queue import ParkingQueue
from .record import ParkedFilter, ParkedMessage
from .replay import ReplayReport, replay

__all__ = [
    "ParkingQueue", "ParkedMessage", "ParkedFilter", "ReplayReport", "replay",
    "Parker", "parker_for", "failure_headers", "parking_message",
    "ParkingError", "ParkingFailed", "ParkedMessageNotFound", "UnsafeToBrowse",
]
