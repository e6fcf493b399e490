"""One recorder per telemetry directory and process, shared by every app writing there (one file per partition)."""

from __future__ import annotations

import os
import threading

from .recorder import TelemetryRecorder

__all__ = ["flush_all", "recorder_for"]

_RECORDERS: dict[str, TelemetryRecorder] = {}
_LOCK = threading.Lock()


def recorder_for(root: str | os.PathLike[str]) -> TelemetryRecorder:
    """The process's recorder for a telemetry directory (created on first use, and again after a close)."""
    key = os.fspath(root)
    rec = _RECORDERS.get(key)
    if rec is not None and not rec.closed:
        return rec
    with _LOCK:
        rec = _RECORDERS.get(key)
        if rec is None or rec.closed:  # a closed one drops everything: start afresh
            rec = _RECORDERS[key] = TelemetryRecorder(key)
        return rec


def flush_all() -> None:
    """Write out every buffered event of this process now (tests, shutdown hooks)."""
    for rec in list(_RECORDERS.values()):
        rec.flush()
