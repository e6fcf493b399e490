"""Delayed-task telemetry: a subscriber that records events, and a fail-safe JSON Lines recorder.

``attach(app, config)`` connects telemetry to one app (``detach(app)`` undoes
it); the events are the named tuples of :mod:`~celery_delayq.telemetry.events`,
written by :class:`TelemetryRecorder` under ``delayq_telemetry_dir``.  The
offline analysis lives in :mod:`celery_delayq.analytics`.
"""

from celery_delayq.telemetry.events import (
    DELAY_EVENTS,
    EVENT_CLASSES,
    EVENT_TYPES,
    FAILURE_EVENTS,
    Cancelled,
    Delivered,
    Exhausted,
    Failed,
    Parked,
    Replayed,
    Retried,
    Scheduled,
    Succeeded,
    TelemetryEvent,
)
from celery_delayq.telemetry.recorder import TelemetryRecorder, encode_event, make_event
from celery_delayq.telemetry.recorders import flush_all, recorder_for
from celery_delayq.telemetry.subscriber import Subscription, attach, detach, subscription_for

__all__ = [
    "DELAY_EVENTS",
    "EVENT_CLASSES",
    "EVENT_TYPES",
    "FAILURE_EVENTS",
    "Cancelled",
    "Delivered",
    "Exhausted",
    "Failed",
    "Parked",
    "Replayed",
    "Retried",
    "Scheduled",
    "Subscription",
    "Succeeded",
    "TelemetryEvent",
    "TelemetryRecorder",
    "attach",
    "detach",
    "encode_event",
    "flush_all",
    "make_event",
    "recorder_for",
    "subscription_for",
]
