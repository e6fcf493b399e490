"""Feed celery_delayq's hooks and Celery's task signals into the telemetry recorder.

Opt-in with one setting, ``delayq_telemetry_dir``. Publishers write
``scheduled``; workers write ``delivered``, ``succeeded``, ``retried`` and
``exhausted``. Every handler returns at once when telemetry is off, and
recording never raises into Celery (the recorder drops and counts instead).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import signals as celery_signals

from .. import headers as H
from .. import signals
from .recorder import TelemetryRecorder, make_event

__all__ = ["recorder_for", "flush_all"]

log = logging.getLogger(__name__)
_RECORDERS: dict[str, TelemetryRecorder] = {}
_LOCK = threading.Lock()


def recorder_for(root: str) -> TelemetryRecorder:
    """The process's recorder for a telemetry root (created on first use)."""
    with _LOCK:
        rec = _RECORDERS.get(root)
        if rec is None:
            rec = _RECORDERS[root] = TelemetryRecorder(root)
        return rec


def flush_all() -> None:
    """Write out every buffered event now (tests, shutdown hooks)."""
    for rec in list(_RECORDERS.values()):
        rec.flush()


def _root_of_task(task: Any) -> str | None:
    from ..integration import router_for

    app = getattr(task, "app", None) or getattr(task, "_app", None)
    router = router_for(app) if app is not None else None
    return router.config.telemetry_dir if router is not None else None


def _task_fields(task: Any, request: Any) -> dict[str, Any]:
    info = getattr(request, "delivery_info", None) or {}
    return {
        "task_id": str(getattr(request, "id", "") or ""),
        "task_name": str(getattr(request, "task", None) if isinstance(getattr(request, "task", None), str)
                         else getattr(task, "name", "") or ""),
        "queue": str(info.get("routing_key") or ""),
        "attempt": int(getattr(request, "retries", 0) or 0),
    }


def _record(root: str, event: str, **fields: Any) -> None:
    try:
        recorder_for(root).record(make_event(event, ts=time.time(), **fields))
    except Exception:  # pragma: no cover - telemetry must never break a task
        log.debug("delayq telemetry: could not record %s", event, exc_info=True)


@signals.message_scheduled.connect
def _on_scheduled(sender: Any = None, plan: Any = None, headers: Any = None, **_: Any) -> None:
    root = getattr(getattr(sender, "config", None), "telemetry_dir", None)
    if not root:
        return
    headers = headers or {}
    _record(root, "scheduled", task_id=str(headers.get("id") or plan.entry), task_name=str(headers.get("task") or ""),
            queue=plan.destination.routing_key, attempt=int(headers.get(H.ATTEMPT) or 0),
            delay_s=float(plan.delay), due_at=float(plan.due), entry=plan.entry, hops=plan.hops)


@signals.message_delivered.connect
def _on_delivered(sender: Any = None, request: Any = None, due: float = 0.0, delay: float = 0.0, **_: Any) -> None:
    root = _root_of_task(sender)
    if root:
        fields = _task_fields(sender, request)
        fields["attempt"] = int((getattr(request, "request_dict", None) or {}).get("retries") or 0)
        _record(root, "delivered", delay_s=float(delay), due_at=float(due), **fields)


@celery_signals.task_success.connect
def _on_success(sender: Any = None, **_: Any) -> None:
    root = _root_of_task(sender)
    if root:
        _record(root, "succeeded", **_task_fields(sender, sender.request))


@celery_signals.task_retry.connect
def _on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    root = _root_of_task(sender)
    if root:
        exc = getattr(reason, "exc", None) or reason
        _record(root, "retried", exception=type(exc).__name__, **_task_fields(sender, request))


@signals.retry_exhausted.connect
def _on_exhausted(sender: Any = None, request: Any = None, exc: Any = None, **_: Any) -> None:
    root = _root_of_task(sender)
    if root:
        _record(root, "exhausted", exception=type(exc).__name__ if exc is not None else "",
                **_task_fields(sender, request))
