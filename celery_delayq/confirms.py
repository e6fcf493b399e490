"""Publisher confirms and mandatory returns on one AMQP channel, pipelined.

A publish is scheduled only once the broker has confirmed it *and* did not
return it as unroutable. Publishes get increasing delivery tags; acks and
nacks settle them (``multiple`` settles everything up to a tag). A return
arrives before the ack of the same message and is matched by the ladder
entry id in the message's headers.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import amqp

from .errors import PublishError, PublishNacked, PublishReturned, PublishTimeout
from .headers import ENTRY

__all__ = ["ConfirmChannel", "Pending"]


@dataclass
class Pending:
    """A published, not yet confirmed message (kept so it can be republished)."""

    entry: str
    message: amqp.Message
    exchange: str
    routing_key: str


class ConfirmChannel:
    """A confirm-mode channel that tracks every unconfirmed publish.

    Not thread-safe by itself: :class:`~celery_delayq.publisher.LadderPublisher`
    serialises access with a lock.
    """

    def __init__(self, connection: amqp.Connection) -> None:
        self.connection = connection
        self.channel = connection.channel()
        self.channel.confirm_select()
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)
        self._next_tag = 1
        self.pending: dict[int, Pending] = {}
        self._returned: dict[str, str] = {}
        self.failures: list[PublishError] = []

    def publish(self, message: amqp.Message, exchange: str, routing_key: str) -> int:
        """Send with ``mandatory`` set; returns the delivery tag to wait for."""
        entry = message.application_headers.get(ENTRY, "")
        self.channel.basic_publish(message, exchange=exchange, routing_key=routing_key, mandatory=True)
        tag = self._next_tag
        self._next_tag += 1
        self.pending[tag] = Pending(entry, message, exchange, routing_key)
        return tag

    def wait(self, upto: int | None = None, *, timeout: float, keep: int = 0) -> None:
        """Block until every publish up to ``upto`` (default all) is settled,
        or until no more than ``keep`` remain unsettled.

        Raises:
            PublishTimeout: the broker did not confirm within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while self._unsettled(upto) > keep:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PublishTimeout(
                    f"no publisher confirm within {timeout:.1f} s for {len(self.pending)} ladder "
                    "message(s); they may or may not be scheduled. Check the broker's health "
                    "(memory/disk alarms block publishers).",
                    failed=[p.entry for p in self.pending.values()],
                )
            try:
                self.connection.drain_events(timeout=left)
            except socket.timeout:
                continue

    def _unsettled(self, upto: int | None) -> int:
        if upto is None:
            return len(self.pending)
        count = 0
        for tag in self.pending:  # insertion order is tag order
            if tag > upto:
                break
            count += 1
        return count

    def take_failures(self) -> list[PublishError]:
        """Failures settled so far, cleared from the channel."""
        out, self.failures = self.failures, []
        return out

    # -- broker callbacks ------------------------------------------------------
    def _settle(self, tag: int, multiple: bool, nacked: bool) -> None:
        if multiple:
            tags = []
            for t in self.pending:  # insertion order is tag order: stop at the first later tag
                if t > tag:
                    break
                tags.append(t)
        else:
            tags = [tag]
        for t in tags:
            item = self.pending.pop(t, None)
            if item is None:
                continue
            reason = self._returned.pop(item.entry, None)
            if nacked:
                self.failures.append(PublishNacked(
                    f"the broker refused ladder message {item.entry} (basic.nack), e.g. a ladder "
                    "queue at its length limit or a failing quorum; it was NOT scheduled",
                    failed=[item.entry]))
            elif reason is not None:
                self.failures.append(PublishReturned(
                    f"ladder message {item.entry} was returned unroutable by exchange "
                    f"{item.exchange!r} ({reason}); the ladder topology is missing or differs. "
                    "It was NOT scheduled.", failed=[item.entry]))

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, nacked=False)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, nacked=True)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: amqp.Message) -> None:
        entry = (message.application_headers or {}).get(ENTRY, "")
        self._returned[entry] = str(getattr(exc, "reply_text", exc))
