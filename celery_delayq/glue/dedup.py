"""Opt-in duplicate-delivery guard: a second delivery of the same (task id, attempt) runs zero times.

Quorum queues dead-letter *at least once*; ``delayq_dedup = True`` costs a Redis round trip per task.
Each delivery claims ``(task id, attempt, replay id)`` (``SET NX``, ``running``) before it runs and
marks it ``done`` after; a delivery that finds it taken is acked and not run (``Ignore``). Never
zero times: a ``redelivered`` message runs unless ``done``, and without Redis it runs (fail open).
"""

from __future__ import annotations

import logging
from typing import Any

from ..ladder.headers import REPLAY
from ..rabbitmq.registry import ProcessRegistry

__all__ = ["DuplicateGuard", "guard_for", "delivery_key"]

log = logging.getLogger(__name__)

_RUNNING, _DONE = b"running", b"done"


def delivery_key(request: Any) -> str:
    """``task id:attempt:replay id`` of a task request (attempt = Celery's ``retries``)."""
    return f"{request.id}:{int(request.retries or 0)}:{request.get(REPLAY) or ''}"


class DuplicateGuard:
    """Remembers deliveries in Redis for ``ttl`` seconds.

    Args:
        url: Redis URL (``redis://host:6379/0``).
        ttl: Seconds to remember a delivery (duplicates trail the original by seconds).
        namespace: Key prefix, so apps sharing a Redis do not collide.
    """

    def __init__(self, url: str, *, ttl: float = 86400.0, namespace: str = "delayq") -> None:
        self.url = url
        self.ttl_ms = max(1, int(ttl * 1000))
        self.namespace = namespace
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The Redis client (created on first use; redis-py reconnects after a fork)."""
        if self._client is None:
            try:
                import redis
            except ImportError as exc:  # pragma: no cover - redis is a declared extra
                raise ImportError("delayq_dedup needs redis-py: pip install 'celery_delayq[redis]'") from exc
            self._client = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)
        return self._client

    def after_fork_in_child(self) -> None:
        """In a forked child: open a client of its own on next use (never the parent's sockets)."""
        self._client = None

    def key(self, delivery: str) -> str:
        """The Redis key of a delivery."""
        return f"{self.namespace}:seen:{delivery}"

    def begin(self, delivery: str, *, redelivered: bool = False) -> bool:
        """Claim ``delivery`` before running it; ``False`` means skip it (a duplicate)."""
        key = self.key(delivery)
        try:
            if self.client.set(key, _RUNNING, nx=True, px=self.ttl_ms):
                return True
            if not redelivered or self.client.get(key) == _DONE:
                return False
            self.client.set(key, _RUNNING, px=self.ttl_ms)  # its consumer died mid-run: take over
            return True
        except Exception as exc:  # any Redis trouble: run rather than risk running zero times
            log.warning("delayq: duplicate guard unavailable (%r); running %s without the guard", exc, delivery)
            return True

    def finish(self, delivery: str) -> None:
        """Mark ``delivery`` done, so a redelivery after a lost ack is skipped too."""
        try:
            self.client.set(self.key(delivery), _DONE, px=self.ttl_ms)
        except Exception as exc:
            log.warning("delayq: duplicate guard could not mark %s done (%r)", delivery, exc)

    def forget(self, delivery: str) -> None:
        """Drop a claim (tests and manual repair)."""
        self.client.delete(self.key(delivery))


_GUARDS: ProcessRegistry[DuplicateGuard] = ProcessRegistry()


def guard_for(url: str, *, ttl: float, namespace: str) -> DuplicateGuard:
    """The process-wide guard for a Redis URL, TTL and namespace."""
    return _GUARDS.get((url, ttl, namespace), lambda: DuplicateGuard(url, ttl=ttl, namespace=namespace))
