"""The kombu-level hook: a ``Producer`` that diverts delayed publishes into the ladder.

Celery publishes every task (``apply_async``, ``send_task``, ``retry``,
canvas, worker-lost retries) through ``kombu.Producer.publish`` taken from
kombu's producer pools. Importing celery_delayq makes those pools build
:class:`DelayqProducer`, which is a plain pass-through until a
:class:`~celery_delayq.router.Router` is registered for its broker. A publish
is diverted only when its headers carry a future ``eta`` (Celery's message
protocol 2) or an ``x-delayq-due``, and the router wants that task; all
other publishes take the unchanged kombu path after one dict lookup. The
one exception is a queue with a default delay (``delayq_queue_delays``):
once any registered app has one, undelayed publishes also look up their
queue's default; apps without queue defaults skip that after one cached flag.
"""

from __future__ import annotations

import threading
from typing import Any

from kombu import Producer, pools

from . import headers as H

__all__ = ["DelayqProducer", "register_router", "unregister_router", "routers"]

_ROUTERS: list[Any] = []
_GENERATION = [0]
_LOCK = threading.Lock()


def register_router(router: Any) -> None:
    """Make producers on ``router``'s broker consult it (idempotent)."""
    with _LOCK:
        if router not in _ROUTERS:
            _ROUTERS.append(router)
            _GENERATION[0] += 1


def unregister_router(router: Any) -> None:
    """Stop consulting ``router`` (used by tests and by :func:`celery_delayq.uninstall`)."""
    with _LOCK:
        if router in _ROUTERS:
            _ROUTERS.remove(router)
            _GENERATION[0] += 1


def routers() -> list[Any]:
    """The registered routers, oldest first."""
    return list(_ROUTERS)


class DelayqProducer(Producer):
    """``kombu.Producer`` that sends delayed publishes through the ladder."""

    _delayq_cache: tuple[int, Any] = (-1, None)

    def _delayq_router(self) -> Any:
        generation, router = self._delayq_cache
        if generation != _GENERATION[0]:
            router = None
            key = _connection_key(self.connection)
            for candidate in reversed(_ROUTERS):
                if candidate.connection_key() == key:
                    router = candidate
                    break
            self._delayq_cache = (_GENERATION[0], router)
        return router

    def publish(self, body: Any, routing_key: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        headers = kwargs.get("headers")
        if args or not _ROUTERS or not headers:
            return super().publish(body, routing_key, *args, **kwargs)
        if headers.get("eta") is None and H.DUE not in headers:
            if not _queue_delays_possible():  # the common case: no queue has a default delay
                return super().publish(body, routing_key, *args, **kwargs)
            router = self._delayq_router()
            due = None if router is None else router.queue_default_due(self, routing_key, kwargs)
            if due is None:
                return super().publish(body, routing_key, *args, **kwargs)
            headers[H.DUE] = due
            return router.publish(self, body, routing_key, kwargs, queue_default=True)
        router = self._delayq_router()
        if router is None:
            return super().publish(body, routing_key, *args, **kwargs)
        return router.publish(self, body, routing_key, kwargs)

    def publish_undelayed(self, body: Any, routing_key: Any, kwargs: dict[str, Any]) -> Any:
        """The unchanged kombu publish (for messages the router leaves alone)."""
        return super().publish(body, routing_key, **kwargs)


_QUEUE_DELAYS: list[Any] = [-1, False]  # [router generation, any router has queue delays]


def _queue_delays_possible() -> bool:
    # Recomputed once per change of the registered routers, at publish time,
    # when the apps' settings are surely loaded (Django loads them late).
    if _QUEUE_DELAYS[0] != _GENERATION[0]:
        possible = False
        for router in list(_ROUTERS):
            try:
                possible = possible or bool(router.queue_delays)
            except Exception:  # pragma: no cover - a broken config fails on its own publishes
                possible = True
        _QUEUE_DELAYS[:] = [_GENERATION[0], possible]
    return bool(_QUEUE_DELAYS[1])


def _connection_key(connection: Any) -> str:
    try:
        return str(connection.as_uri(include_password=True))
    except Exception:  # pragma: no cover - a connection without a URI never matches
        return ""


# Pools created from now on build DelayqProducer; pools that already exist are
# switched by celery_delayq.install(app) for that app's broker.
pools.ProducerPool.Producer = DelayqProducer
