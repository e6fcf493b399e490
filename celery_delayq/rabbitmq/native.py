"""``delayq_backend = "native"``: the broker holds each message itself, per message, in a quorum queue.

A message carrying ``x-opt-delivery-time`` (epoch ms) goes straight to its (quorum) destination queue, which
holds it until then: no ladder, no hop. Below :data:`NATIVE_DELAY_VERSION` this backend refuses with
:class:`~celery_delayq.errors.BrokerTooOld`; which brokers have the delays and what was measured: docs/api.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import amqp
from kombu.connection import Connection

from ..config import DelayqConfig
from ..errors import BrokerTooOld, PublishError
from ..ladder import headers as H
from ..typing import Scheduling, WorkerService
from .confirms import OwnedConnection, Tracker, confirm_block
from .registry import ProcessRegistry
from .client import broker_version

__all__ = ["NativeDelays", "NativeReceipt", "NATIVE_DELAY_VERSION", "DELIVERY_TIME"]

#: The first RabbitMQ release assumed to park ``x-opt-delivery-time`` messages (after 4.3; unconfirmed for 4.4.0).
NATIVE_DELAY_VERSION = (4, 5)
#: The message annotation (epoch ms) a quorum queue holds a message until.
DELIVERY_TIME = "x-opt-delivery-time"


@dataclass(frozen=True)
class NativeReceipt:
    """What the broker was asked to hold: a :class:`~celery_delayq.typing.Receipt`, one hop, to the destination."""

    entry: str
    due: float
    delay: float
    exchange: str
    routing_key: str
    hops: int = 1


class NativeDelays:
    """The ``native`` backend: the broker's own per-message delay, on a confirm channel of its own."""

    @classmethod
    def for_connection(cls, connection: Connection, config: DelayqConfig) -> "NativeDelays":
        """The process-wide instance for a broker and settings.

        Raises:
            BrokerTooOld: the broker cannot hold a message per message (before :data:`NATIVE_DELAY_VERSION`).
        """
        key = (connection.as_uri(include_password=True), config)
        return _NATIVE.get(key, lambda: cls(connection, config))

    def __init__(self, connection: Connection, config: DelayqConfig) -> None:
        self.config = config
        self._link = OwnedConnection(connection, role="native delays")
        self._lock = threading.RLock()
        self._local = threading.local()
        with self._lock:
            self._link.open()
            version = broker_version(self._link.raw)
        if version < NATIVE_DELAY_VERSION:
            self._link.drop()
            shown = ".".join(map(str, version))
            raise BrokerTooOld(
                f"delayq backend 'native' needs RabbitMQ {'.'.join(map(str, NATIVE_DELAY_VERSION))}+ "
                f"(per-message delays in quorum queues, x-opt-delivery-time); this broker is {shown}, "
                "which would deliver such a message at once. Use delayq_backend = 'ladder' (any delay) "
                "or 'fixed' (a few fixed delays) instead.")

    def after_fork_in_child(self) -> None:
        """In a forked child: a fresh lock and connection."""
        self._lock = threading.RLock()
        self._local = threading.local()
        self._link.after_fork_in_child()

    def place(self, body: bytes | str, *, entry: str, due: float, delay: float, exchange: str, routing_key: str,
              headers: dict[str, Any], content_type: str | None = None, content_encoding: str | None = None,
              queue_hint: str | None = None, **properties: Any) -> tuple[NativeReceipt, dict[str, Any]]:
        """Publish to the destination itself, held by the broker until ``due`` (confirmed unless batched)."""
        hdrs = H.stamp_pass(H.strip_broker_headers(headers), due=due, delay=delay, entry=entry, hops=1,
                            exchange=exchange, routing_key=routing_key)
        hdrs[DELIVERY_TIME] = int(due * 1000) + 1  # never early: rounded up to the next millisecond
        properties.setdefault("delivery_mode", 2)
        message = amqp.Message(body, content_type=content_type, content_encoding=content_encoding,
                               application_headers=hdrs, **properties)
        name = str(headers.get("id") or entry)
        with self._lock:
            batch: Tracker | None = getattr(self._local, "tracker", None)
            confirm = self._link.confirm or self._link.open()
            confirm.publish(message, exchange, routing_key, batch or (tracker := Tracker()), name=name)
            if batch is None:
                confirm.wait(timeout=self.config.confirm_timeout, tracker=tracker)
                _raise(tracker)
        return NativeReceipt(entry, due, delay, exchange, routing_key), hdrs

    def confirming(self) -> ContextManager[None]:
        """Await the block's confirms together when it ends (nested blocks join)."""
        return confirm_block(self._local, self._settle)

    def _settle(self, tracker: Tracker) -> None:
        with self._lock:
            confirm = self._link.confirm
            if confirm is not None and tracker.outstanding:
                confirm.wait(timeout=self.config.confirm_timeout, tracker=tracker)
        _raise(tracker)

    def worker_service(self, connection_for: Callable[[str], Connection],
                       scheduling: Scheduling) -> WorkerService | None:
        """Nothing: the broker holds the messages."""
        return None


def _raise(tracker: Tracker) -> None:
    failures: list[PublishError] = tracker.take_failures()
    if failures:
        raise failures[0]


_NATIVE: ProcessRegistry[NativeDelays] = ProcessRegistry()
