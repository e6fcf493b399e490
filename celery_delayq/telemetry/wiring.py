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
from collections.abc import Callable
from typing import Any

from celery import signals as celery_signals

from .. import headers as H
from .. import signals
from .recorder import TelemetryRecorder

__all__ = ["recorder_for", "flush_all"]

log = logging.getLogger(__name__)
_now = time.time
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


# -- finding the recorder (hot path: once per event) ------------------------------------
#
# The router installed on an app holds the settings (read once, on first use);
# the resolved recorder (or None when telemetry is off) is cached on the router
# itself.  A new install, or another app, means another router, so the cache
# can't go stale; uninstall makes router_for() return None.

_CACHE_ATTR = "_delayq_telemetry"
_router_for: Callable[[Any], Any] | None = None  # integration.router_for, imported on first use


def _recorder_of_router(router: Any) -> TelemetryRecorder | None:
    try:
        return getattr(router, _CACHE_ATTR)[0]
    except AttributeError:
        pass
    root = router.config.telemetry_dir
    rec = recorder_for(root) if root else None
    try:
        setattr(router, _CACHE_ATTR, (rec,))
    except AttributeError:  # pragma: no cover - a router that takes no attributes: no cache
        pass
    return rec


def _recorder_of_task(task: Any) -> TelemetryRecorder | None:
    global _router_for
    app = getattr(task, "app", None) or getattr(task, "_app", None)
    if app is None:
        return None
    router_for = _router_for
    if router_for is None:  # a module-level import would be circular
        from ..integration import router_for

        _router_for = router_for
    router = router_for(app)
    return None if router is None else _recorder_of_router(router)


def _recorder_of_root(root: str) -> TelemetryRecorder:
    return _RECORDERS.get(root) or recorder_for(root)


# -- the hooks ----------------------------------------------------------------------------
#
# Field rules (unchanged): task_id = request id, task_name = the request's task
# name (else the task's), queue = the delivery routing key, attempt = Celery's
# retries counter; missing values become "" / 0.  Values are handed over raw:
# the recorder's writer thread formats (and, if ever needed, coerces) them.


def _log_failure(event: str) -> None:  # pragma: no cover - telemetry must never break a task
    log.debug("delayq telemetry: could not record %s", event, exc_info=True)


@signals.message_scheduled.connect
def _on_scheduled(sender: Any = None, plan: Any = None, headers: Any = None, **_: Any) -> None:
    try:
        root = sender.config.telemetry_dir
    except AttributeError:
        return
    if not root:
        return
    try:
        headers = headers or {}
        entry = plan.entry
        _recorder_of_root(root).record_task_event(
            "scheduled", headers.get("id") or entry, headers.get("task") or "",
            plan.destination.routing_key, headers.get(H.ATTEMPT) or 0, _now(),
            plan.delay, plan.due, entry, plan.hops)
    except Exception:  # pragma: no cover
        _log_failure("scheduled")


@signals.message_delivered.connect
def _on_delivered(sender: Any = None, request: Any = None, due: float = 0.0, delay: float = 0.0,
                  **_: Any) -> None:
    try:
        rec = _recorder_of_task(sender)
        if rec is None:
            return
        # A worker Request's own retries counter is in the message it carries.
        attempt = (getattr(request, "request_dict", None) or {}).get("retries") or 0
        rec.record_task_event("delivered", *_task_fields(sender, request), attempt, _now(), delay, due)
    except Exception:  # pragma: no cover
        _log_failure("delivered")


@celery_signals.task_success.connect
def _on_success(sender: Any = None, **_: Any) -> None:
    try:
        rec = _recorder_of_task(sender)
        if rec is None:
            return
        request = sender.request
        rec.record_task_event("succeeded", *_task_fields(sender, request), _retries(request), _now())
    except Exception:  # pragma: no cover
        _log_failure("succeeded")


def _task_fields(task: Any, request: Any) -> tuple[Any, Any, Any]:
    """``(task_id, task_name, queue)`` of a request.

    Celery's own request types (worker ``Request``, task ``Context``) have every
    attribute, so they are read directly (this runs twice per task); anything
    else is read attribute by attribute with defaults.
    """
    try:
        task_id, name, info = request.id, request.task, request.delivery_info
    except AttributeError:
        task_id = getattr(request, "id", "")
        name = getattr(request, "task", None)
        info = getattr(request, "delivery_info", None)
    if not isinstance(name, str):
        name = getattr(task, "name", "")
    return task_id or "", name or "", (info.get("routing_key") if info else None) or ""


def _retries(request: Any) -> Any:
    return getattr(request, "retries", 0) or 0


@celery_signals.task_retry.connect
def _on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    try:
        rec = _recorder_of_task(sender)
        if rec is None:
            return
        exc = getattr(reason, "exc", None) or reason
        rec.record_task_event("retried", *_task_fields(sender, request), _retries(request), _now(),
                              type(exc).__name__)
    except Exception:  # pragma: no cover
        _log_failure("retried")


@signals.retry_exhausted.connect
def _on_exhausted(sender: Any = None, request: Any = None, exc: Any = None, **_: Any) -> None:
    try:
        rec = _recorder_of_task(sender)
        if rec is None:
            return
        rec.record_task_event("exhausted", *_task_fields(sender, request), _retries(request), _now(),
                              type(exc).__name__ if exc is not None else "")
    except Exception:  # pragma: no cover
        _log_failure("exhausted")
