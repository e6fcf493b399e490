"""Delayed-task telemetry: ``attach(app)`` records the events of :mod:`~celery_delayq.telemetry.events`
through a fail-safe JSON Lines :class:`TelemetryRecorder`; also metrics, the last hour and the event files
(the PySpark report is :mod:`celery_delayq.analytics`). Public names: each module's ``__all__``."""

from celery_delayq.telemetry import events, recorder, subscriber
from celery_delayq.telemetry.events import *
from celery_delayq.telemetry.recorder import *
from celery_delayq.telemetry.subscriber import *

__all__ = []
__all__ += events.__all__
__all__ += recorder.__all__
__all__ += subscriber.__all__
