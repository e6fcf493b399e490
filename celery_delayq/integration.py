"""Celery glue: install the ladder on an app, declare it when a worker starts.

Thin on purpose: it wires the router (what to divert), the publisher
(how to publish) and Celery's extension points (bootsteps, signals) together.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from celery import bootsteps, signals as celery_signals
from celery._state import connect_on_app_finalize

from . import headers as H
from . import signals
from .producer import DelayqProducer, register_router, unregister_router
from .router import Router
from .telemetry import wiring as _telemetry_wiring  # noqa: F401  (connects the telemetry hooks)

__all__ = ["install", "uninstall", "router_for", "DelayqWorkerStep"]

log = logging.getLogger(__name__)

_APP_ROUTERS: "weakref.WeakKeyDictionary[Any, Router]" = weakref.WeakKeyDictionary()


def router_for(app: Any) -> Router | None:
    """The router installed on ``app``, if any."""
    return _APP_ROUTERS.get(app)


def install(app: Any) -> Router:
    """Hook the ladder into ``app`` (idempotent) and return its router.

    After this, delayed publishes of :class:`~celery_delayq.DelayedRetryTask`
    tasks, or of every task when ``delayq_enabled`` is set, wait in the
    ladder; workers declare the ladder when they start.
    """
    router = _APP_ROUTERS.get(app)
    if router is not None:
        return router
    router = _APP_ROUTERS[app] = Router(app)
    if app.Task.Request == "celery.worker.request:Request":
        # App-wide: plain tasks skip the eta timer for due ladder deliveries too.
        app.Task.Request = "celery_delayq.request:LadderRequest"
    register_router(router)
    pool = getattr(app.amqp, "_producer_pool", None)
    if pool is not None:  # created before install: make it build our producers too
        pool.Producer = DelayqProducer
        for item in list(getattr(pool._resource, "queue", [])):
            if type(item) is not DelayqProducer and isinstance(item, DelayqProducer.__mro__[1]):
                item.__class__ = DelayqProducer
    if DelayqWorkerStep not in app.steps["consumer"]:
        app.steps["consumer"].add(DelayqWorkerStep)
    return router


def uninstall(app: Any) -> None:
    """Undo :func:`install` (mostly for tests): delayed publishes go the Celery way again."""
    router = _APP_ROUTERS.pop(app, None)
    if router is not None:
        unregister_router(router)
        app.steps["consumer"].discard(DelayqWorkerStep)


class DelayqWorkerStep(bootsteps.StartStopStep):
    """Worker bootstep: declare (or verify) the ladder before consuming."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, c: Any) -> None:
        router = router_for(c.app)
        if router is None:
            return
        topology = router.publisher.declare()
        log.info("delayq: ladder %r ready (%s queues, unit %d ms, max %.0f s)",
                 router.config.prefix, topology.queue_type, router.config.unit_ms,
                 router.config.spec.max_delay_s)


@connect_on_app_finalize
def _install_when_enabled(app: Any) -> None:
    # The app-wide switch works without code: any app finalized after
    # celery_delayq is imported gets the hook when delayq_enabled is set.
    try:
        enabled = bool(app.conf.get("delayq_enabled") or app.conf.get("DELAYQ_ENABLED")
                       or app.conf.get("CELERY_DELAYQ_ENABLED"))
    except Exception:  # pragma: no cover - a broken config is reported by Celery itself
        enabled = False
    if enabled:
        install(app)


@celery_signals.task_received.connect
def _on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Emit :data:`~celery_delayq.signals.message_delivered` for messages that left the ladder."""
    info = getattr(request, "request_dict", None) or {}
    due = info.get(H.DUE)
    if due is None or H.ENTRY not in info:
        return
    now = time.time()
    signals.message_delivered.send(sender=request.task, request=request, due=float(due),
                                   delay=float(info.get(H.DELAY) or 0.0), lateness=now - float(due))
