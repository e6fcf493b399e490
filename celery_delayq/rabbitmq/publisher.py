"""Publish messages into the ladder: publisher confirms, mandatory flag, no silent loss.

One :class:`LadderPublisher` per process and broker (the default delay backend) owns a dedicated confirm-mode
connection, so the app's own publishes pay nothing extra. :meth:`~LadderPublisher.place` returns once the broker
confirmed the message; inside :meth:`~LadderPublisher.confirming` (:func:`celery_delayq.batch`) up to
``batch_window`` stay unconfirmed and leaving the block awaits the rest. On a dropped connection unconfirmed
messages are republished (at-least-once); when that fails, the :class:`~celery_delayq.errors.PublishError` names
in ``failed`` every message that may not be scheduled.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from datetime import datetime, timezone
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager, NamedTuple, Sequence, TypeVar

import amqp
from kombu.connection import Connection

from ..ladder import headers as H
from ..config import DelayqConfig
from .confirms import ConfirmChannel, OwnedConnection, Pending, Tracker, combine, confirm_block, fail
from ..errors import BrokerUnavailable, PublishError, PublishTimeout
from ..ladder.entries import new_entry
from ..ladder.spec import LadderSpec
from .registry import ProcessRegistry
from .budget import BudgetCheck
from .management import ManagementAPI
from .placement import LeaderPlacement
from .topology import Destination, Topology, resolve_queue_type
from .client import broker_version
from ..ladder.index_layout import index_layout
from .worker import LadderWorker
from ..typing import Scheduling

__all__ = ["LadderPublisher", "LadderReceipt", "Route", "publisher_for", "plan"]

log = logging.getLogger(__name__)

_RECOVERABLE = (amqp.exceptions.RecoverableConnectionError, ConnectionError, OSError)
#: Connections opened per call before giving up, without sleeping (a stopped broker refuses at once).
_ATTEMPTS = 3

R = TypeVar("R")


@dataclass(frozen=True)
class LadderReceipt:
    """What the ladder (or ``fixed``) did with one message: a :class:`~celery_delayq.typing.Receipt`
    with its route. Returned by every delayed publish, carried by the signals as ``plan``."""

    entry: str
    due: float
    delay: float
    units: int
    hops: int
    exchange: str
    routing_key: str
    destination: Destination


def topology_for(template: Connection, config: DelayqConfig, raw: amqp.Connection, *, explicit: bool,
                 route_check: bool = True) -> Topology:
    """The configured ladder on the broker behind ``raw`` (nothing declared), with the management API's
    route check, leader placement (``delayq_leader_placement``) and RabbitMQ 3.x file-handle budget."""
    version = broker_version(raw)
    topology = Topology(config.spec, resolve_queue_type(config.queue_type, version),
                        index=index_layout(config.spec, index=config.index, version=version))
    api = ManagementAPI.for_broker(template, raw, config.management_url)
    spread = config.leader_placement == "spread"
    if api is not None:
        topology.route_check = api.routes if route_check else None
        if spread:
            topology.placement = LeaderPlacement(api, template).place
    topology.budget = BudgetCheck(version, api, spread=spread, explicit=explicit)
    return topology


class Route(NamedTuple):
    """Where a backend's route sends one message (:meth:`LadderPublisher.place_on`)."""

    units: int
    exchange: str
    routing_key: str
    hops: int
    #: A per-message TTL (ms) the message is published with, or ``None`` (the queue's own TTL).
    expiration_ms: int | None = None


def plan(spec: LadderSpec, destination: Destination, *, due: float, now: float,
         shard: int = 0) -> tuple[int, str, str, int]:
    """Pure: ``(units, entry exchange, ladder routing key, hops)`` for a due time (in shard ``shard``)."""
    units = spec.units_for(due - now)
    return (units, *spec.route(units, destination.token, shard))


def _names(items: Sequence[Pending]) -> dict[str, list[str]]:
    """``failed`` and ``entries`` of a :class:`PublishError` about ``items``."""
    return {"failed": [p.name for p in items], "entries": [p.entry for p in items]}


class LadderPublisher:
    """Publishes into one ladder over a dedicated confirm-mode connection.

    Thread-safe; fork-safe (a child process reconnects on first use).
    """

    @classmethod
    def for_connection(cls, connection: Connection, config: DelayqConfig) -> "LadderPublisher":
        """The process-wide publisher for a broker and configuration (``delayq_backend = "ladder"``)."""
        return publisher_for(connection, config)

    def __init__(self, connection: Connection, config: DelayqConfig, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.template = connection
        self.config = config
        self.spec = config.spec
        self.clock = clock
        self._lock = threading.RLock()
        self._local = threading.local()
        self._link = OwnedConnection(connection, role="ladder publisher")
        #: Unconfirmed publishes of a lost connection, republished on the next one.
        self._orphans: collections.deque[Pending] = collections.deque()
        self.topology: Topology | None = None
        #: Set by :meth:`declare` for an explicit creation (see there).
        self._explicit = False
        self._worker: LadderWorker | None = None

    # -- connection ---------------------------------------------------------------
    @property
    def link(self) -> OwnedConnection:
        """The dedicated connection (its options: ``link.describe()``)."""
        return self._link

    def raw_connection(self) -> amqp.Connection:
        """The py-amqp connection, connected and with the ladder declared or verified.

        Raises:
            BrokerUnavailable: the broker cannot be reached (tried once per host).
        """
        with self._lock:
            self._io(Tracker(), lambda confirm: None)
            return self._link.raw

    def declare(self, *, explicit: bool = False) -> Topology:
        """Declare (or verify) the ladder now rather than at the first publish.

        ``explicit``: an operator's deliberate creation (``delayq topology declare``), made on
        RabbitMQ 3.x even where its file-handle cost cannot be checked.

        Raises:
            FileHandleBudgetExceeded: a new ladder would not fit RabbitMQ 3.x's file handles.
            FileHandleBudgetUnknown: a new ladder on 3.x, no API to check it, and not ``explicit``.
        """
        with self._lock:
            self._explicit = explicit
            try:
                self.raw_connection()
            finally:
                self._explicit = False
            assert self.topology is not None
            self.topology.streams_ready()
        return self.topology

    def close(self) -> None:
        """Wait for outstanding confirms, then close the ladder connection."""
        with self._lock:
            confirm = self._link.confirm
            if confirm is not None and confirm.pending:
                with contextlib.suppress(PublishError, *_RECOVERABLE):
                    confirm.wait(timeout=self.config.confirm_timeout)
            self._link.drop()

    def after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's connection, lock and batches."""
        self._lock = threading.RLock()
        self._local = threading.local()
        self._orphans = collections.deque()
        self._link.after_fork_in_child()

    def _live(self) -> ConfirmChannel:
        """The confirm channel, (re)connected, with the ladder declared and orphans republished."""
        confirm = self._link.confirm
        if confirm is not None and not confirm.pending and self._link.idle_too_long():
            log.debug("delayq: ladder connection idle past its heartbeat; reconnecting")
            confirm = None
        if confirm is None:
            confirm = self._link.open()
        if self.topology is None:
            raw = self._link.raw
            topology = topology_for(self.template, self.config, raw, explicit=self._explicit)
            if self.config.declare:
                topology.declare(raw, defer_streams=True)  # streams: before the first index entry
            elif topology.verify(raw) == "topic":  # a ladder of 1.0.0rc1 or earlier, not ours to extend
                self.spec = replace(self.spec, entries="topic")
            self.topology = topology
        if self._orphans:
            log.warning("delayq: republishing %d unconfirmed ladder message(s) on a new connection",
                        len(self._orphans))
            while self._orphans:  # pop only once sent: a failure leaves the rest orphaned
                confirm.adopt(self._orphans[0])
                self._orphans.popleft()
        return confirm

    def _io(self, tracker: Tracker, op: Callable[[ConfirmChannel], R], also: Sequence[tuple[str, str]] = ()) -> R:
        """Run ``op`` on a live channel, reconnecting (and republishing) if the connection drops.

        On giving up every unconfirmed publish fails; the error names ``tracker``'s and ``also``
        (messages the caller holds, not tracked yet: read when it raises, so ``op`` may empty it once it sent them).
        """
        cause: BaseException | None = None
        for _ in range(_ATTEMPTS):
            try:
                result = op(self._live())
                self._link.touch()
                return result
            except _RECOVERABLE as exc:
                cause = exc
                self._lose(exc)
            except BrokerUnavailable as exc:
                fail(self._orphans, lambda items: BrokerUnavailable(
                    f"{exc}; the connection had dropped before the broker confirmed these", **_names(items)))
                self._orphans.clear()
                raise combine(tracker.take_failures(), also=also, cause=exc) from exc.__cause__
            except PublishTimeout as exc:
                self._abandon(lambda items: PublishTimeout(
                    f"no publisher confirm within {self.config.confirm_timeout:.1f} s; the "
                    f"connection was closed, so {len(items)} ladder message(s) may or may not be "
                    "scheduled. Check the broker's health (memory/disk alarms block publishers).", **_names(items)))
                raise combine(tracker.take_failures(), also=also, cause=exc) from None
            except (amqp.exceptions.ChannelError, amqp.exceptions.IrrecoverableConnectionError) as exc:
                confirm = self._link.confirm
                if isinstance(exc, amqp.exceptions.ChannelError) and confirm is not None and confirm.channel.is_open:
                    raise  # another channel's error (a declare): the confirm channel is fine
                self._abandon(lambda items: PublishError(
                    f"the broker closed the ladder's channel ({exc!r}); {len(items)} ladder "
                    "message(s) may not be scheduled", **_names(items)))
                raise combine(tracker.take_failures(), also=also, cause=PublishError(str(exc))) from exc
        lost = PublishError(f"lost the broker connection {_ATTEMPTS} times in a row ({cause!r}); "
                            "the unconfirmed messages may not be scheduled")
        self._abandon(lambda items: PublishError(str(lost), **_names(items)))
        raise combine(tracker.take_failures(), also=also, cause=lost) from cause

    def _lose(self, exc: BaseException) -> None:
        """The connection dropped: keep its unconfirmed publishes to republish, forget it."""
        log.warning("delayq: ladder connection lost (%r); reconnecting", exc)
        confirm = self._link.confirm
        if confirm is not None:
            self._orphans.extendleft(reversed(confirm.take()))
        self._link.drop()

    def _abandon(self, error: Callable[[list[Pending]], PublishError]) -> None:
        """Give the connection up: every unconfirmed publish fails in its own tracker."""
        confirm = self._link.confirm
        items = (confirm.take() if confirm is not None else []) + list(self._orphans)
        self._orphans.clear()
        fail(items, error)
        self._link.drop()

    # -- publishing ------------------------------------------------------------------
    def plan_pass(self, exchange: str, routing_key: str, headers: dict[str, Any], *, delay: float) -> tuple[str, str]:
        """Plan one pass to ``exchange``/``routing_key`` in ``delay`` s for a caller that publishes itself.

        Stamps ``headers`` in place; returns ``(entry exchange, ladder routing key)``. Replay
        publishes inside a transaction, which a confirm-mode channel cannot do.
        """
        self.declare()
        topology = self.topology
        assert topology is not None
        dest = topology.destination(exchange, routing_key)
        topology.ensure_exit(self.raw_connection(), dest, declare=self.config.declare)
        now = self.clock()
        due = now + delay
        entry = new_entry()
        _units, entry_exchange, ladder_key, hops = plan(self.spec, dest, due=due, now=now,
                                                        shard=self.spec.shard_of(str(headers.get("id") or entry)))
        H.stamp_pass(headers, due=due, delay=delay, entry=entry, hops=hops,
                     exchange=exchange, routing_key=routing_key)
        if "eta" in headers:  # a Celery message: request.eta tells the task when it is due
            headers["eta"] = datetime.fromtimestamp(due, tz=timezone.utc).isoformat()
        return entry_exchange, ladder_key

    def place(self, body: bytes | str, *, entry: str, due: float, delay: float, exchange: str, routing_key: str,
              headers: dict[str, Any], content_type: str | None = None, content_encoding: str | None = None,
              queue_hint: str | None = None, **properties: Any) -> tuple[LadderReceipt, dict[str, Any]]:
        """The backend contract (:meth:`~celery_delayq.typing.DelayBackend.place`): into the ladder.

        Raises:
            PublishError: the message (and, inside :meth:`confirming`, every other one
                that may not be scheduled) is named in ``failed`` by task id.
        """
        return self.place_on(lambda dest, due, now, shard: plan(self.spec, dest, due=due, now=now, shard=shard),
                             body, entry=entry, due=due, delay=delay, exchange=exchange, routing_key=routing_key,
                             headers=headers, content_type=content_type,
                             content_encoding=content_encoding, queue_hint=queue_hint, **properties)

    def place_on(self, route: Callable[[Destination, float, float, int], Route | tuple[int, str, str, int]],
                 body: bytes | str, *, entry: str, due: float, delay: float, exchange: str, routing_key: str,
                 headers: dict[str, Any], content_type: str | None = None, content_encoding: str | None = None,
                 queue_hint: str | None = None, **properties: Any) -> tuple[LadderReceipt, dict[str, Any]]:
        """:meth:`place` with the route chosen by ``route(destination, due, now, shard)`` ->
        ``(units, exchange, routing key, hops)`` or a :class:`Route` with a per-message expiration (the fixed
        queues and the due-time buckets use it); longer delays make laps.
        """
        # A per-message TTL would expire inside a level: dropped (Celery's ``expires`` still works).
        properties.pop("expiration", None)
        this = ((str(headers.get("id") or properties.get("message_id") or entry), entry),)
        with self._lock:
            batch: Tracker | None = getattr(self._local, "tracker", None)  # inside confirming()
            tracker = batch if batch is not None else Tracker()

            # Longer than the ladder: its longest wait into the laps queue (celery_delayq.rabbitmq.laps).
            remaining = due - self.clock()
            lapping = remaining > self.spec.max_delay_s
            target = ("", self.spec.laps_queue) if lapping else (exchange, routing_key)

            def prepare(confirm: ConfirmChannel) -> Destination:
                assert self.topology is not None  # _live() declared it
                dest = self.topology.destination(*target)
                self.topology.ensure_exit(confirm.connection, dest, declare=self.config.declare,
                                          queue_hint=None if lapping else queue_hint)
                return dest

            # A destination checked before needs no broker call: the publish's own _io connects.
            topology = self.topology
            dest = topology.ensured(*target) if topology is not None else None
            if dest is None:
                dest = self._io(tracker, prepare, this)
            # After connecting and declaring, so a first publish does not wait that long twice.
            now = self.clock()
            shard = self.spec.shard_of(this[0][0])
            if lapping:
                units, entry_x, ladder_key, hops = plan(self.spec, dest, due=min(due, now + self.spec.max_delay_s),
                                                        now=now, shard=shard)
            else:
                chosen = Route(*route(dest, due, now, shard))
                units, entry_x, ladder_key, hops = chosen[:4]
                if chosen.expiration_ms is not None:  # a due-time bucket: everything in it expires together
                    properties["expiration"] = str(chosen.expiration_ms)
            sched = LadderReceipt(entry, due, delay, units, hops, entry_x, ladder_key, dest)
            hdrs = H.stamp_pass(H.strip_broker_headers(headers), due=due, delay=delay, entry=entry, hops=hops,
                                exchange=exchange, routing_key=routing_key)
            if lapping:
                hdrs[H.LAPS] = int(hdrs.get(H.LAPS) or 0) + 1
            if queue_hint:
                hdrs[H.QUEUE] = queue_hint
            properties.setdefault("delivery_mode", 2)
            message = amqp.Message(body, content_type=content_type, content_encoding=content_encoding,
                                   application_headers=hdrs, **properties)
            name, timeout = this[0][0], self.config.confirm_timeout
            if batch is not None:
                self._io(tracker, lambda c: c.publish(message, entry_x, ladder_key, tracker, name=name), this)
                window = self.config.batch_window
                confirm = self._link.confirm
                if confirm is not None and len(confirm.pending) > window:  # drain to half: in runs
                    self._io(tracker, lambda c: c.wait(timeout=timeout, keep=window // 2))
                return sched, hdrs
            # Confirm each: the publish and its wait in one pass of _io (one liveness check, one handler). Once
            # sent, the message is the channel's: a dropped connection republishes it (_live), the retry only
            # waits, and a failure names it through the tracker, no longer through ``unsent``.
            unsent = list(this)

            def publish_and_wait(c: ConfirmChannel) -> None:
                if unsent:
                    c.publish(message, entry_x, ladder_key, tracker, name=name)
                    unsent.clear()
                c.wait(timeout=timeout, tracker=tracker)

            self._io(tracker, publish_and_wait, unsent)
            self._raise_failures(tracker)
        return sched, hdrs

    def _raise_failures(self, tracker: Tracker) -> None:
        failures = tracker.take_failures()
        if failures:
            raise combine(failures)

    def worker_service(self, connection_for: Callable[[str], Connection], scheduling: Scheduling) -> LadderWorker:
        """The worker service (:mod:`.worker`): declare, relay laps, move held queues; one per publisher."""
        if self._worker is None:
            self._worker = LadderWorker(self, connection_for, scheduling)
        return self._worker

    def confirming(self) -> ContextManager[None]:
        """The backend contract's batch: await the block's confirms together when it ends.

        Raises :class:`PublishError` naming every message nacked, returned or lost
        with the connection (nothing named twice). Nested blocks join the outer one.
        """
        return confirm_block(self._local, self._settle)

    def _settle(self, tracker: Tracker) -> None:
        with self._lock:
            if tracker.outstanding:
                self._io(tracker, lambda c: c.wait(timeout=self.config.confirm_timeout, tracker=tracker))
            self._raise_failures(tracker)


_PUBLISHERS: ProcessRegistry[LadderPublisher] = ProcessRegistry()


def publisher_for(connection: Connection, config: DelayqConfig) -> LadderPublisher:
    """The process-wide publisher for a broker and configuration (created on first use)."""
    key = (connection.as_uri(include_password=True), config)
    return _PUBLISHERS.get(key, lambda: LadderPublisher(connection, config))
