"""Delays longer than the ladder: laps through it, put back by a relay in every worker.

The default ladder holds 31 days (its top TTL is bounded by Erlang's 2^32 ms
timers), but renewals, trials and reminders are scheduled months or years
ahead. A longer delay is published for the ladder's longest wait into the
``<prefix>.laps`` queue instead of its destination; :class:`LapRelay`, which
every worker of the app runs, takes it from there and schedules it again
for what remains, to its real destination once that fits. The topology
stays bounded (one extra queue), a message is never early (each lap ends no
later than the due time), and each lap costs one consume and one confirmed
publish, once per ladder span (31 days by default).

With no worker running, messages wait in the laps queue, durable, and go on
when one starts: later than due, never lost. ``delayq_max_delay`` caps the
delays accepted, for those who want a cap.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import amqp

from ..ladder import headers as H
from ..typing import Scheduling
from .following import QueueFollower

__all__ = ["LapRelay", "relay_lap"]

log = logging.getLogger(__name__)

_PASSED_ON = frozenset({"application_headers", "content_type", "content_encoding"})


def relay_lap(publisher: Scheduling, message: amqp.Message, *, now: float | None = None) -> Any:
    """Schedule a message that finished a lap again, for what remains of its delay (confirmed).

    Raises:
        PublishError: it could not be scheduled (the caller must not ack it).
    """
    headers = dict(message.headers or {})
    due = float(headers[H.DUE])
    exchange, routing_key = str(headers[H.EXCHANGE]), str(headers[H.ROUTING_KEY])
    H.forget_pass(headers)
    properties = {k: v for k, v in (message.properties or {}).items() if k not in _PASSED_ON}
    now = time.time() if now is None else now
    return publisher.schedule(message.body, due=due, delay=max(0.0, due - now), exchange=exchange,
                              routing_key=routing_key, headers=headers,
                              content_type=message.properties.get("content_type"),
                              content_encoding=message.properties.get("content_encoding"), **properties)


class LapRelay(QueueFollower):
    """Consumes the laps queue in a thread of its own and puts each message back into the ladder.

    Every worker runs one; they share the queue as competing consumers. A
    message is acked only once its next lap is confirmed, so a crash in
    between repeats it (at least once, like every ladder hop).
    """

    role = "lap relay"

    def __init__(self, publisher: Scheduling, connection: Any, queue: str, *, prefetch: int = 100) -> None:
        super().__init__(connection, queue, prefetch=prefetch, thread_name="delayq-laps")
        self.publisher = publisher
        self.relayed = 0

    def on_message(self, channel: amqp.Channel, message: amqp.Message) -> None:
        """Schedule the next lap; ack once it is confirmed, else requeue after a pause."""
        try:
            relay_lap(self.publisher, message)
        except Exception:
            log.exception("delayq: could not put a lap back into the ladder; it stays in %r", self.queue)
            # Back to the queue (a classic queue: no delivery limit), after a pause.
            self._stop.wait(1.0)
            channel.basic_reject(message.delivery_tag, requeue=True)
            return
        channel.basic_ack(message.delivery_tag)
        self.relayed += 1
