"""A stream read that stops at its marker while the broker still delivers: the channel closes quietly.

Writers append to an index shard during a read (a worker's delivery, a new delayed task), so the broker
can still be sending deliveries when the reader meets its marker. Closing the channel with the consumer
active made py-amqp log "Received method (60, 60) during closing channel 1" once per delivery in flight
(8-10 times per page read of the web page); the reader cancels its consumer first.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import amqp
import pytest

from celery_delayq.index.stream import StreamReader, append
from celery_delayq.ladder.headers import ENTRY
from celery_delayq.ladder.index_layout import MARKER


class _WrittenAfter(StreamReader):
    """A reader whose marker is followed at once by ``after`` entries (as concurrent writers would)."""

    after = 300

    def write_marker(self) -> str:
        token = uuid.uuid4().hex
        entries = [({MARKER: token, ENTRY: token}, None)] + [({ENTRY: f"later-{i}"}, None) for i in range(self.after)]
        assert not append(self.connection, self.queue, entries, timeout=30)
        return token


def test_a_read_ending_while_deliveries_are_in_flight_logs_nothing(amqp_conn: amqp.Connection, uid: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    queue = f"stream-close.{uid}"
    ch = amqp_conn.channel()
    ch.queue_declare(queue, durable=True, auto_delete=False, arguments={"x-queue-type": "stream"})
    try:
        assert not append(amqp_conn, queue, [({ENTRY: f"before-{i}"}, None) for i in range(50)], timeout=30)
        for k in range(3):
            reader: Any = _WrittenAfter(amqp_conn, queue, prefetch=1000)
            with caplog.at_level(logging.WARNING, logger="amqp"):
                got = [h[ENTRY] for _o, h, _m in reader.read("first", (ENTRY,))]
            # Up to its own marker: the entries before it, and the earlier reads' "later" ones.
            assert got[:50] == [f"before-{i}" for i in range(50)] and len(got) == 50 + k * reader.after
        noise = [r.getMessage() for r in caplog.records if r.name == "amqp"]
        assert not noise, noise[:3]
        assert amqp_conn.channel().is_open  # the connection is still usable
    finally:
        ch.queue_delete(queue)
        ch.close()
