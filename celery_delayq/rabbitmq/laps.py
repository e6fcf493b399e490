"""Delays longer than the ladder (31 days by default): laps through it, put back by a relay in every worker.

A longer delay waits the ladder's longest wait into ``<prefix>.laps``; :class:`LapRelay` schedules
it again for what remains. One extra queue, never early, one consume and confirmed publish per
lap; with no worker running they wait there, durable. ``delayq_max_delay`` caps delays.
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
    """Consumes the laps queue (competing with other workers) and puts each message back into the ladder.

    A message is acked only once its next lap is confirmed (at least once, like every hop).
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
