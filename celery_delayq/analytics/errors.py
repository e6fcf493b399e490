"""Exceptions raised by the analytics job (no pyspark import, so callers can
catch them without the optional dependency loaded).

A missing events directory is :class:`celery_delayq.telemetry.files.EventsNotFoundError`
(the file lister's, read without Spark too)."""

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
