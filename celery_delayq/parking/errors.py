"""Errors of the parking queue. Each says what happened to the message and what to do."""

from __future__ import annotations

from ..errors import DelayqError

__all__ = ["ParkingError", "ParkingFailed", "ParkedMessageNotFound", "UnsafeToBrowse"]


class ParkingError(DelayqError):
    """Base class of parking-queue errors."""


class ParkingFailed(ParkingError):
    """A failed task's message could not be moved to its parking queue.

    The task still fails (its FAILURE state and ``task_failure`` signal
    happen); the error says whether the message is parked or not.
    """


class ParkedMessageNotFound(ParkingError, LookupError):
    """No parked message has the given id (prefix)."""


class UnsafeToBrowse(ParkingError):
    """Reading the parking queue could make the broker drop parked messages (a quorum delivery limit).

    Raised before any message is taken; the message says how to fix the queue.
    """
