"""Publish messages into the ladder: publisher confirms, mandatory flag, no silent loss.

One :class:`LadderPublisher` per process and broker owns a dedicated
connection whose channel is in confirm mode, so the app's own publishes keep
whatever ``confirm_publish`` setting they had and pay nothing extra.

Two ways to wait for confirms:

* **one by one** (default): ``publish`` returns only once the broker has
  confirmed the message, or raises :class:`~celery_delayq.errors.PublishError`.
* **pipelined** inside :meth:`LadderPublisher.batch` (or :func:`celery_delayq.batch`):
  publishes return at once, up to ``batch_window`` stay unconfirmed, and
  leaving the block waits for the rest and raises if any was nacked or
  returned. Confirms stay on; they are only awaited together.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import amqp
import kombu
from kombu.serialization import dumps

from . import headers as H
from . import signals
from .config import DelayqConfig
from .confirms import ConfirmChannel
from .delays import due_from
from .errors import PublishError, UnsupportedTransport
from .ladder import LadderSpec
from .owned import OwnsConnection
from .registry import ProcessRegistry
from .topology import Destination, Topology, broker_version, resolve_queue_type

__all__ = ["LadderPublisher", "Scheduled", "publisher_for", "plan"]

log = logging.getLogger(__name__)

_RECOVERABLE = (amqp.exceptions.RecoverableConnectionError, ConnectionError, OSError)


@dataclass(frozen=True)
class Scheduled:
    """What the ladder did with one message. Returned by every publish."""

    entry: str
    due: float
    delay: float
    units: int
    hops: int
    exchange: str
    routing_key: str
    destination: Destination


def plan(spec: LadderSpec, destination: Destination, *, due: float, now: float) -> tuple[int, str, str, int]:
    """Pure: ``(units, entry exchange, ladder routing key, hops)`` for a due time."""
    units = spec.units_for(due - now)
    return (units, *spec.route(units, destination.token))


@dataclass
class _Batch:
    entries: set[str] = field(default_factory=set)
    scheduled: list[tuple[Scheduled, dict[str, Any]]] = field(default_factory=list)
    last_tag: int = 0


class LadderPublisher(OwnsConnection):
    """Publishes into one ladder over a dedicated confirm-mode connection.

    Thread-safe; fork-safe (a child process reconnects on first use).
    """

    _lock_type = threading.RLock

    def __init__(self, connection: kombu.Connection, config: DelayqConfig, *, clock: Any = time.time) -> None:
        self.template = connection
        self.config = config
        self.spec = config.spec
        self.clock = clock
        self._lock = threading.RLock()
        self._local = threading.local()
        self._pid = 0
        self._conn: kombu.Connection | None = None
        self._confirm: ConfirmChannel | None = None
        self.topology: Topology | None = None

    # -- connection ---------------------------------------------------------------
    def raw_connection(self) -> amqp.Connection:
        """The py-amqp connection, connected and with the ladder declared or verified."""
        with self._lock:
            if self._conn is None or self._pid != os.getpid():
                self._connect()
            assert self._conn is not None
            return self._conn.connection

    def _connect(self) -> None:
        self._drop()
        conn = self.template.clone()
        if conn.transport.driver_type != "amqp":
            raise UnsupportedTransport(
                f"the delay ladder needs RabbitMQ (AMQP 0-9-1); broker transport is "
                f"{conn.transport.driver_type!r}. Use an amqp:// or pyamqp:// broker URL.")
        conn.connect()
        raw = conn.connection
        if not isinstance(raw, amqp.Connection):
            raise UnsupportedTransport("the delay ladder needs kombu's 'pyamqp' transport (py-amqp)")
        if self.topology is None:
            qtype = resolve_queue_type(self.config.queue_type, broker_version(raw))
            self.topology = Topology(self.spec, qtype)
            if self.config.declare:
                self.topology.declare(raw)
            else:
                self.topology.verify(raw)
        self._conn, self._pid = conn, os.getpid()
        self._confirm = ConfirmChannel(raw)

    def close(self) -> None:
        """Wait for outstanding confirms, then close the ladder connection."""
        with self._lock:
            if self._confirm is not None and self._pid == os.getpid() and self._confirm.pending:
                with contextlib.suppress(PublishError):
                    self._confirm.wait(timeout=self.config.confirm_timeout)
            self._drop()

    def declare(self) -> Topology:
        """Declare (or verify) the ladder now rather than at the first publish."""
        self.raw_connection()
        assert self.topology is not None
        return self.topology

    # -- publishing ------------------------------------------------------------------
    def publish(self, body: Any, *, delay: float | None = None, eta: Any = None,
                exchange: str = "", routing_key: str = "", queue: str | None = None,
                serializer: str = "json", headers: Mapping[str, Any] | None = None,
                **properties: Any) -> Scheduled | None:
        """Publish any message with a delay, to an exchange and routing key or to a queue.

        This is the plain-kombu entry point; Celery tasks get here through
        :class:`~celery_delayq.producer.DelayqProducer`. Returns ``None`` (and
        publishes nothing) when the delay is zero or negative: the caller
        should then publish normally, as Celery does with a past eta.
        """
        if queue is not None:
            exchange, routing_key = "", queue
        due = due_from(delay, eta, now=self.clock())
        if due is None:
            return None
        content_type, content_encoding, payload = dumps(body, serializer=serializer)
        return self.schedule(payload, due=due, delay=delay if delay is not None else due - self.clock(),
                             exchange=exchange, routing_key=routing_key, headers=dict(headers or {}),
                             content_type=content_type, content_encoding=content_encoding, **properties)

    def schedule(self, body: bytes | str, *, due: float, delay: float, exchange: str, routing_key: str,
                 headers: dict[str, Any], content_type: str | None = None,
                 content_encoding: str | None = None, queue_hint: str | None = None,
                 **properties: Any) -> Scheduled:
        """Put an already serialised message into the ladder (confirmed, mandatory)."""
        now = self.clock()
        properties.pop("expiration", None)  # a per-message TTL would make it skip levels early
        with self._lock:
            raw = self.raw_connection()
            assert self.topology is not None
            dest = self.topology.destination(exchange, routing_key)
            self.topology.ensure_exit(raw, dest, declare=self.config.declare, queue_hint=queue_hint)
            units, entry_x, ladder_key, hops = plan(self.spec, dest, due=due, now=now)
            entry = uuid.uuid4().hex
            sched = Scheduled(entry, due, delay, units, hops, entry_x, ladder_key, dest)
            hdrs = H.strip_broker_headers(headers)
            hdrs.update({H.DUE: due, H.DELAY: delay, H.ENTRY: entry, H.HOPS: hops,
                         H.EXCHANGE: exchange, H.ROUTING_KEY: routing_key})
            if "retries" in hdrs:  # a Celery task message: Celery's own counter is the truth
                hdrs[H.ATTEMPT] = int(hdrs["retries"] or 0)
            else:
                hdrs.setdefault(H.ATTEMPT, 0)
            hdrs.setdefault(H.FIRST_ATTEMPT, now)
            signals.before_schedule.send(sender=self, plan=sched, headers=hdrs)
            properties.setdefault("delivery_mode", 2)
            message = amqp.Message(body, content_type=content_type, content_encoding=content_encoding,
                                   application_headers=hdrs, **properties)
            batch: _Batch | None = getattr(self._local, "batch", None)
            tag = self._send(message, entry_x, ladder_key)
            if batch is not None:
                batch.entries.add(entry)
                batch.scheduled.append((sched, hdrs))
                batch.last_tag = tag
                window = self.config.batch_window
                assert self._confirm is not None
                if len(self._confirm.pending) > window:
                    # Drain down to half the window, so confirms are read in runs
                    # rather than one frame per publish.
                    self._wait(upto=None, keep=window // 2)
                return sched
            self._wait(upto=tag)
            self._raise_failures({entry})
        signals.message_scheduled.send(sender=self, plan=sched, headers=hdrs)
        return sched

    def _send(self, message: amqp.Message, exchange: str, routing_key: str) -> int:
        for attempt in range(3):
            try:
                assert self._confirm is not None
                return self._confirm.publish(message, exchange, routing_key)
            except _RECOVERABLE as exc:
                self._recover(exc, attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self, upto: int | None, keep: int = 0) -> None:
        for attempt in range(3):
            try:
                assert self._confirm is not None
                self._confirm.wait(upto, timeout=self.config.confirm_timeout, keep=keep)
                return
            except _RECOVERABLE as exc:
                # Tags restart on the new channel; every unconfirmed message is sent
                # again, so wait for all of them.
                self._recover(exc, attempt)
                upto = None

    def _recover(self, exc: BaseException, attempt: int) -> None:
        """Reconnect and republish every unconfirmed message (at-least-once)."""
        if attempt >= 2:
            raise PublishError(f"lost the broker connection while scheduling ({exc!r}); "
                               "the unconfirmed messages were NOT scheduled") from exc
        log.warning("delayq: ladder connection lost (%r); reconnecting and republishing", exc)
        old = self._confirm
        pending = list(old.pending.values()) if old is not None else []
        failures = old.take_failures() if old is not None else []
        time.sleep(0.2 * (attempt + 1))
        self._connect()
        assert self._confirm is not None
        self._confirm.failures.extend(failures)
        for item in pending:
            self._confirm.publish(item.message, item.exchange, item.routing_key)

    def _raise_failures(self, entries: set[str]) -> None:
        assert self._confirm is not None
        mine = [f for f in self._confirm.failures if set(f.failed) & entries]
        if not mine:
            return
        self._confirm.failures = [f for f in self._confirm.failures if f not in mine]
        if len(mine) == 1:
            raise mine[0]
        failed = [e for f in mine for e in f.failed]
        raise type(mine[0])(f"{len(mine)} ladder messages were not scheduled; first: {mine[0]}", failed=failed)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Pipeline confirms for every publish in the block (same thread).

        On exit, waits for all of them; raises :class:`PublishError` listing the
        entry ids that were nacked or returned. Nested blocks join the outer one.
        """
        if getattr(self._local, "batch", None) is not None:
            yield
            return
        b = self._local.batch = _Batch()
        try:
            yield
        finally:
            self._local.batch = None
            if b.entries:
                with self._lock:
                    self._wait(upto=None)
                    failed_entries = set()
                    try:
                        self._raise_failures(b.entries)
                    except PublishError as exc:
                        failed_entries = set(exc.failed)
                        raise
                    finally:
                        for sched, hdrs in b.scheduled:
                            if sched.entry not in failed_entries:
                                signals.message_scheduled.send(sender=self, plan=sched, headers=hdrs)


_PUBLISHERS: ProcessRegistry[LadderPublisher] = ProcessRegistry()


def publisher_for(connection: kombu.Connection, config: DelayqConfig) -> LadderPublisher:
    """The process-wide publisher for a broker and configuration (created on first use)."""
    key = (connection.as_uri(include_password=True), config)
    return _PUBLISHERS.get(key, lambda: LadderPublisher(connection, config))
