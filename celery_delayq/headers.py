"""Names of the message headers celery_delayq reads and writes, and header hygiene.

The ladder's own bookkeeping travels in ``x-delayq-*`` headers so that any
consumer, the parking queue and the telemetry can tell where a message has
been without asking the broker.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = [
    "DUE", "DELAY", "ENTRY", "ATTEMPT", "FIRST_ATTEMPT", "EXCHANGE", "ROUTING_KEY", "HOPS",
    "strip_broker_headers",
]

#: Epoch seconds at which the message is due at its destination.
DUE = "x-delayq-due"
#: The delay that was requested, in seconds (before rounding up to units).
DELAY = "x-delayq-delay"
#: Unique id of this pass through the ladder; a redelivery of the same pass repeats it.
ENTRY = "x-delayq-entry"
#: Attempt number (0 for the first run), our own counter: RabbitMQ 4.x ignores client x-death.
ATTEMPT = "x-delayq-attempt"
#: Wall-clock epoch seconds of the first attempt, so time-based stop rules survive restarts.
FIRST_ATTEMPT = "x-delayq-first-attempt"
#: Where an undelayed publish would have gone.
EXCHANGE = "x-delayq-exchange"
ROUTING_KEY = "x-delayq-routing-key"
#: Queues the message waits in, for telemetry and the broker-cost benchmark.
HOPS = "x-delayq-hops"

_BROKER_PREFIXES = ("x-first-death-", "x-last-death-")


def strip_broker_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``headers`` without ``x-death`` and ``x-{first,last}-death-*``.

    RabbitMQ before 4.0.1 honours a client-sent ``x-death``; its cycle
    detection then silently drops a retried message that passes the same
    ladder queue again. The ladder re-enters the same queues on every retry,
    so these headers must never be republished.
    """
    return {
        k: v for k, v in headers.items()
        if k != "x-death" and not k.startswith(_BROKER_PREFIXES)
    }
