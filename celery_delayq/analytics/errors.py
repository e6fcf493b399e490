"""Exceptions raised by the analytics job, importable without pyspark (a missing events directory:
:class:`celery_delayq.telemetry.files.EventsNotFoundError`)."""

from __future__ import annotations

__all__ = ["AnalyticsError", "MissingDependencyError", "NoValidEventsError"]


class AnalyticsError(Exception):
    """Base class: the report cannot be produced for a reason the user can fix."""


class NoValidEventsError(AnalyticsError):
    """The events directory holds no valid event (empty, or only malformed lines)."""

    def __init__(self, message: str, malformed: int = 0) -> None:
        super().__init__(message)
        self.malformed = malformed


class MissingDependencyError(AnalyticsError, ImportError):
    """pyspark (the ``celery_delayq[analytics]`` extra) is not installed."""
