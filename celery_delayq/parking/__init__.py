"""Parking queues: where a DelayedRetryTask's message goes when its retries are exhausted (docs/retries.md).

:class:`ParkingQueue` lists, inspects, replays, purges and redeclares one (the CLI's ``delayq parking``);
:class:`ParkedMessage` and :class:`ParkedFilter` are a parked message and a filter; :class:`Parker` parks.
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
