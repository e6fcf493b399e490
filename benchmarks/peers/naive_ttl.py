"""Peer (d): the naive retry queue: one wait queue, per-message TTL (``expiration``).

The wait queue dead-letters into the destination queue. RabbitMQ expires a
per-message TTL only at the head of the queue, so a short delay published
behind a long one waits for the long one: head-of-line blocking.
Publishes go through a kombu ``Producer`` with ``confirm_publish``, as an
application would write it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import kombu

from .base import Peer, Publisher, raw_body

DEST = "dqbench.naive"
WAIT = "dqbench.naive.wait"


class NaiveTtlPeer(Peer):
    """Per-message TTL in a single wait queue."""

    name = "naive"
    title = "Naive per-message-TTL queue"
    modes = ("publish",)

    def __init__(self, url: str, **opts: Any) -> None:
        super().__init__(url, **opts)
        self._conn: kombu.Connection | None = None

    @property
    def dest_queue(self) -> str:
        return DEST

    def connection(self) -> kombu.Connection:
        if self._conn is None:
            self._conn = kombu.Connection(self.url, transport_options={"confirm_publish": True}, heartbeat=0)
            self._conn.connect()
        return self._conn

    def declare(self) -> None:
        ch = self.connection().default_channel
        kombu.Queue(DEST, durable=True)(ch).declare()
        kombu.Queue(WAIT, durable=True, queue_arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": DEST})(ch).declare()

    def publisher(self, mode: str) -> Publisher:
        if mode != "publish":
            raise ValueError(f"unknown naive mode {mode!r}")
        return _NaivePublisher(kombu.Producer(self.connection().default_channel))

    def queues(self) -> list[str]:
        return [WAIT, DEST]

    def expected_hops(self, delay_s: float) -> float:
        return 1.0

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.release()
            self._conn = None


class _NaivePublisher(Publisher):
    def __init__(self, producer: kombu.Producer) -> None:
        self.producer = producer

    def send(self, due: float, seq: int) -> None:
        # Whole milliseconds, rounded up, so the TTL alone never makes it early
        # (kombu sends str(int(expiration * 1000)); the +0.5 ms survives the int()).
        ttl_ms = max(0, -(-int((due - time.time()) * 1_000_000) // 1000))
        self.producer.publish(raw_body(due, seq), routing_key=WAIT, exchange="",
                              expiration=(ttl_ms + 0.5) / 1000.0,
                              content_type="application/json", content_encoding="utf-8",
                              delivery_mode=2)
