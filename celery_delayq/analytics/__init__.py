"""Offline analysis of delayed-task telemetry with PySpark (``pip install 'celery_delayq[analytics]'``).

Importing it does not import pyspark: :func:`run_report`, :func:`read_events`, :func:`build_tables`
and :func:`create_session` load it on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from celery_delayq.analytics.errors import AnalyticsError, MissingDependencyError, NoValidEventsError
from celery_delayq.telemetry.files import EventsNotFoundError

if TYPE_CHECKING:
    from celery_delayq.analytics.job import run_report
    from celery_delayq.analytics.reader import read_events
    from celery_delayq.analytics.session import create_session
    from celery_delayq.analytics.tables import build_tables

__all__ = ["AnalyticsError", "EventsNotFoundError", "MissingDependencyError", "NoValidEventsError", "build_tables",
           "create_session", "read_events", "run_report"]

_LAZY = {
    "run_report": "celery_delayq.analytics.job",
    "read_events": "celery_delayq.analytics.reader",
    "build_tables": "celery_delayq.analytics.tables",
    "create_session": "celery_delayq.analytics.session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("pyspark", "py4j", "matplotlib"):
            raise MissingDependencyError(f"{name} needs the analytics extra: pip install 'celery_delayq[analytics]' "
                                         f"({exc})") from exc
        raise
    globals()[name] = value
    return value
