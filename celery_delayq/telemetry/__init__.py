"""Delayed-task telemetry: a fail-safe JSON Lines event recorder.

Stdlib only (no pyspark, no celery) so that producers can always import it;
the offline analysis lives in :mod:`celery_delayq.analytics`.
"""

from celery_delayq.telemetry.recorder import (
    DELAY_EVENTS,
    EVENT_TYPES,
    FAILURE_EVENTS,
    TelemetryRecorder,
    make_event,
)

__all__ = ["DELAY_EVENTS", "EVENT_TYPES", "FAILURE_EVENTS", "TelemetryRecorder", "make_event"]
