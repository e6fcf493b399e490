"""Per-queue default delays: a task sent to such a queue without a countdown waits its default.

``delayq_queue_delays = {"slow": 30}`` or ``DelayedQueue("slow", delay=30)`` in ``task_queues``
(nothing on the broker). A message's own countdown or eta always wins, a past eta too.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from kombu import Queue

from ..typing import CeleryApp

__all__ = ["DelayedQueue", "queue_delays_of", "default_delay"]


class DelayedQueue(Queue):
    """A kombu ``Queue`` whose tasks wait ``delay`` seconds unless they carry their own delay.

    Example: ``task_queues = [DelayedQueue("slow", routing_key="slow", delay=30)]``.
    The delay is client-side metadata; nothing about it is declared on the broker.
    """

    attrs = Queue.attrs + (("delay", float),)  # type: ignore[assignment]  # kombu copies attrs on bind

    delay: float | None = None


def queue_delays_of(app: CeleryApp, configured: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Queue name -> default delay, from ``DelayedQueue`` entries and the setting (which wins)."""
    delays: dict[str, float] = {}
    try:
        queues = list(app.amqp.queues.values())
    except Exception:  # pragma: no cover - an app without queues has no DelayedQueue
        queues = []
    for queue in queues:
        delay = getattr(queue, "delay", None)
        if isinstance(queue, DelayedQueue) and delay:
            delays[queue.name] = float(delay)
    delays.update(dict(configured))
    return {name: d for name, d in delays.items() if d > 0}


def default_delay(delays: Mapping[str, float], exchange: str, routing_key: str | None,
                  declare: Iterable[Any] | None) -> float | None:
    """The default delay of the queue a publish is headed for (in ``declare``, or the default exchange's key)."""
    for entity in declare or ():
        name = getattr(entity, "name", None)
        if isinstance(name, str) and name in delays and hasattr(entity, "queue_arguments"):
            return delays[name]
    if exchange == "" and routing_key is not None and routing_key in delays:
        return delays[routing_key]
    return None
