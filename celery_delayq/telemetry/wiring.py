"""Deprecated: telemetry switched on by importing this module.

Telemetry is now a subscriber (:func:`celery_delayq.telemetry.attach`), which
the Celery glue attaches when an app sets ``delayq_telemetry_dir``.  Until the
glue does so, importing this module keeps the old behaviour: the first event
of an app whose installed ladder has a telemetry directory attaches telemetry
to it (and records that event), an uninstall or a new install is followed on
the next event.  An app that was attached explicitly is left alone, so
nothing is recorded twice.  Delete this module (and its import) once
``install()`` calls ``attach()``.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from celery import signals as celery_signals

from .. import signals
from . import subscriber as _sub
from .recorders import flush_all, recorder_for

__all__ = ["flush_all", "recorder_for"]

log = logging.getLogger(__name__)

# app -> (the router we followed, whether we attached telemetry for it)
_FOLLOWED: "weakref.WeakKeyDictionary[Any, tuple[Any, bool]]" = weakref.WeakKeyDictionary()
_AUTO_ROOTS: set[str] = set()


def _router_for(app: Any) -> Any:
    from ..integration import router_for  # the cycle this module is deprecated for

    return router_for(app)


def _follow(signal: Any, sender: Any, kwargs: dict[str, Any]) -> None:
    app = getattr(sender, "_app", None)
    if app is None:
        return
    router = _router_for(app)
    followed = _FOLLOWED.get(app)
    if followed is not None and followed[0] is router:
        return
    current = _sub.subscription_for(app)
    if current is not None and (followed is None or not followed[1]):
        return  # attached explicitly: not ours to manage
    root = router.config.telemetry_dir if router is not None else None
    if not root:
        if current is not None:
            current.detach()
        _FOLLOWED[app] = (router, False)
        return
    subscription = _sub.attach(app, router.config)
    _FOLLOWED[app] = (router, True)
    # Receivers connected during a dispatch miss it: record this event here.
    for sig, receiver in subscription._receivers:
        if sig is signal:
            receiver(sender=sender, **kwargs)


def _worker_shim(signal: Any) -> Any:
    def receiver(sender: Any = None, **kwargs: Any) -> None:
        try:
            kwargs.pop("signal", None)
            _follow(signal, sender, kwargs)
        except Exception:  # pragma: no cover - telemetry must never break a task
            log.debug("delayq telemetry: could not follow the app's settings", exc_info=True)

    return receiver


def _on_scheduled(sender: Any = None, **kwargs: Any) -> None:
    try:
        config = sender.config
        root = config.telemetry_dir
    except AttributeError:
        return
    if not root or root in _AUTO_ROOTS or root in _sub._TAPS:
        return
    was_listening = bool(_sub._TAPS)
    _sub._tap_acquire(root, _sub._parking_queue(config))
    _AUTO_ROOTS.add(root)
    if not was_listening:  # the tap's receiver was connected during this dispatch
        kwargs.pop("signal", None)
        _sub._on_scheduled(sender=sender, **kwargs)


_SHIMS = [
    (sig, _worker_shim(sig))
    for sig in (signals.message_delivered, celery_signals.task_success, celery_signals.task_retry,
                signals.retry_exhausted, signals.message_parked, celery_signals.task_failure,
                celery_signals.task_revoked, signals.message_cancelled)
]


def connect() -> None:
    """Connect the shim (done on import)."""
    for sig, receiver in _SHIMS:
        sig.connect(receiver, weak=False, dispatch_uid=("delayq.telemetry.wiring", sig.name))
    signals.message_scheduled.connect(_on_scheduled, weak=False, dispatch_uid="delayq.telemetry.wiring")


def disconnect() -> None:
    """Disconnect the shim: only explicitly attached telemetry records (tests of the subscriber)."""
    for sig, _ in _SHIMS:
        sig.disconnect(dispatch_uid=("delayq.telemetry.wiring", sig.name))
    signals.message_scheduled.disconnect(dispatch_uid="delayq.telemetry.wiring")


connect()
