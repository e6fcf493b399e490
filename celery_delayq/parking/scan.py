"""Read a parking queue message by message, without losing any.

AMQP 0-9-1 has no non-destructive read, so a scan takes each message with
``basic.get`` and manual acks, and whatever the caller does not ack goes
back to the queue when the scan's channel closes, which also happens when
the process dies. A scan visits at most the messages that were in the queue
when it started, so a queue still filling up cannot keep it running forever.

Note: returned messages count as deliveries; on RabbitMQ >= 4.0 a quorum
parking queue's ``delivery-limit`` (20 by default) then applies to browsing
too. Use a classic parking queue there, or a policy that lifts the limit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import amqp

from .record import ParkedMessage

__all__ = ["Scan", "queue_depth"]


def queue_depth(connection: amqp.Connection, queue: str) -> int | None:
    """Ready messages in ``queue``, or ``None`` when the queue does not exist."""
    ch = connection.channel()
    try:
        return int(ch.queue_declare(queue, passive=True).message_count)
    except amqp.NotFound:
        return None
    finally:
        with contextlib.suppress(Exception):
            ch.close()


class Scan:
    """One pass over a parking queue on a channel of its own (transactional if asked).

    Use as a context manager; leaving it closes the channel, which returns
    every message that was not acked (and rolls back an uncommitted transaction).
    """

    def __init__(self, connection: amqp.Connection, queue: str, *, transactional: bool = False) -> None:
        self.connection = connection
        self.queue = queue
        self.total = queue_depth(connection, queue) or 0
        self.channel = connection.channel()
        if transactional:
            self.channel.tx_select()

    def __iter__(self) -> Iterator[tuple[amqp.Message, ParkedMessage]]:
        for _ in range(self.total):
            message = self.channel.basic_get(self.queue, no_ack=False)
            if message is None:
                return
            yield message, ParkedMessage.from_amqp(message)

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()
