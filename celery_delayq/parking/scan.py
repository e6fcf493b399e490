"""Read a parking queue message by message, without losing any, however often it is read (docs/retries.md).

A scan takes the messages that were there when it started (manual acks, through a consumer whose prefetch
covers the pass) and hands back what the caller did not ack: after checking the delivery limit
(:func:`~.limits.check_browsable`), with ``basic.nack(requeue)``, to the end of the pass even when the caller
stops early (a partial hand-back rotates a quorum queue), then waits until the broker has put them back.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import deque
from typing import Iterator

from ..rabbitmq.client import Connection, Message, broker_version, nack
from ..rabbitmq.probe import queue_depth
from .limits import check_browsable
from .record import ParkedMessage

__all__ = ["Scan"]

#: Longest wait for handed-back messages to be ready again (it takes milliseconds).
RETURN_WAIT = 5.0
#: AMQP 0-9-1's prefetch-count is 16 bits; 0 (unlimited) delivers nothing from a 3.10 quorum queue.
MAX_PREFETCH = 65535
#: Seconds without a delivery after which ``basic.get`` asks whether anything is left.
IDLE = 0.5


class Scan:
    """One pass over a parking queue on a channel of its own (transactional if asked), as a context manager.

    :meth:`ack` (and :meth:`commit`) take messages off; leaving hands every other one back, in
    order, and rolls back an uncommitted batch.

    Raises:
        UnsafeToBrowse: the queue has a delivery limit that a hand-back would count
            towards (``check_limit=False`` skips the check, for a scan that acks everything).
    """

    def __init__(self, connection: Connection, queue: str, *, transactional: bool = False,
                 check_limit: bool = True) -> None:
        self.connection = connection
        self.queue = queue
        depth = queue_depth(connection, queue)
        if depth is not None and check_limit:
            check_browsable(connection, queue, broker_version(connection))
        self.total = depth or 0
        self.transactional = transactional
        self.channel = connection.channel()
        if transactional:
            self.channel.tx_select()
        self._held: set[int] = set()
        self._uncommitted: list[int] = []
        self._left = self.total
        self._arrived: deque[Message] = deque()
        self._got: set[int] = set()  # tags taken by basic.get rather than delivered to the consumer
        self._consumer: str | None = None
        if self.total:
            self.channel.basic_qos(0, min(self.total, MAX_PREFETCH), False)
            self._consumer = self.channel.basic_consume(queue, no_ack=False, callback=self._arrived.append)

    def _take(self) -> Message | None:
        if self._left <= 0:
            return None
        if not self._arrived:
            with contextlib.suppress(socket.timeout):
                self.connection.drain_events(timeout=IDLE)
        if not self._arrived:  # the prefetch is used up, or the queue holds fewer than counted
            message = self.channel.basic_get(self.queue, no_ack=False)
            if message is None:
                self._left = 0
                return None
            self._arrived.append(message)  # after any delivery that came before it: order is kept
            self._got.add(message.delivery_tag)
        message = self._arrived.popleft()
        self._left -= 1
        self._held.add(message.delivery_tag)
        return message

    def _stop_consuming(self) -> None:
        """Cancel the consumer; what it delivered meanwhile is held too, so it is handed back."""
        if self._consumer is not None:
            self.channel.basic_cancel(self._consumer)
            self._consumer = None
        self._held.update(m.delivery_tag for m in self._arrived)
        self._arrived.clear()

    def __iter__(self) -> Iterator[tuple[Message, ParkedMessage]]:
        while (message := self._take()) is not None:
            yield message, ParkedMessage.from_amqp(message)

    def ack(self, message: Message) -> None:
        """Take ``message`` off the queue (at the next :meth:`commit` in a transactional scan)."""
        self.channel.basic_ack(message.delivery_tag)
        self._held.discard(message.delivery_tag)
        if self.transactional:
            self._uncommitted.append(message.delivery_tag)

    def commit(self) -> None:
        """Commit the transaction: its publishes and acks take effect together."""
        self.channel.tx_commit()
        self._uncommitted.clear()

    def close(self, *, finish_pass: bool = True) -> None:
        """Hand back every message not taken (an uncommitted batch's too), then close the channel."""
        try:
            while finish_pass and self._take() is not None:
                pass
            self._stop_consuming()  # before the hand-back, which it would otherwise receive again
            if self.transactional and self._uncommitted:
                self.channel.tx_rollback()  # an unfinished batch: its publishes and acks are void
                self._held.update(self._uncommitted)
                self._uncommitted.clear()
            self._hand_back()
        except Exception:  # noqa: BLE001 - a dead connection: the broker hands them back itself
            pass
        finally:
            with contextlib.suppress(Exception):
                self.channel.close()

    def _hand_back(self) -> None:
        if not self._held:
            return
        ready = queue_depth(self.connection, self.queue) or 0
        # One by one, in order. The broker returns consumer and basic.get deliveries of one
        # multiple nack, or of one commit, in two groups (3.10), which would move the messages
        # past the 65,535th ahead: a transaction commits at each change of source.
        source = None
        for tag in sorted(self._held):
            if self.transactional and source is not None and source != (tag in self._got):
                self.channel.tx_commit()
            source = tag in self._got
            nack(self.channel, tag)
        if self.transactional:
            self.channel.tx_commit()
        self._got.clear()
        expected, self._held = ready + len(self._held), set()
        deadline, pause = time.monotonic() + RETURN_WAIT, 0.002
        while (queue_depth(self.connection, self.queue) or 0) < expected and time.monotonic() < deadline:
            time.sleep(pause)  # a concurrent consumer can keep it below: then give up after RETURN_WAIT
            pause = min(pause * 2, 0.05)

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(finish_pass=exc_type is None)
