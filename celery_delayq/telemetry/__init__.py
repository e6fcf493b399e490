"""Delayed-task telemetry: a subscriber that records events, and a fail-safe JSON Lines recorder.

``attach(app, config)`` connects telemetry to one app (``detach(app)`` undoes
it); the events are the named tuples of :mod:`~celery_delayq.telemetry.events`,
written by :class:`TelemetryRecorder` under ``delayq_telemetry_dir``.  Beside
them, read without Spark: :mod:`~celery_delayq.telemetry.metrics` (the
Prometheus endpoint), :mod:`~celery_delayq.telemetry.lasthour` (the web page's
last hour) and :mod:`~celery_delayq.telemetry.files` (the event files).  The
offline PySpark report lives in :mod:`celery_delayq.analytics`.

The public names are each module's ``__all__``, listed there once.
"""

from celery_delayq.telemetry import events, recorder, recorders, subscriber
from celery_delayq.telemetry.events import *
from celery_delayq.telemetry.recorder import *
from celery_delayq.telemetry.recorders import *
from celery_delayq.telemetry.subscriber import *

__all__ = []
__all__ += events.__all__
__all__ += recorder.__all__
__all__ += recorders.__all__
__all__ += subscriber.__all__
