"""``delayq_backend = "fixed"``: one TTL queue per destination and distinct delay, one hop.

A message waits in one queue whose ``x-message-ttl`` is its delay, then dead-letters straight into its
destination: one hop where the ladder costs about five for delays of seconds (issue #25). Never early, bounded
(``delayq_fixed_queues``); what does not fit goes through the ladder. Its design: docs/how-it-works.md.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable, ContextManager

import amqp
from kombu.connection import Connection

from ..config import DelayqConfig
from ..errors import DelayqError
from ..ladder.spec import LadderSpec
from ..typing import Scheduling
from .publisher import LadderPublisher, LadderReceipt, Route, plan, publisher_for
from .registry import ProcessRegistry
from .topology import Destination
from .worker import LadderWorker

__all__ = ["FixedDelays", "fixed_ttl_ms", "fixed_queue_name", "fixed_queue_prefix"]

log = logging.getLogger(__name__)


def fixed_ttl_ms(remaining_s: float, *, resolution_s: float, max_delay_s: float) -> int | None:
    """Pure: the TTL (ms) for a remaining delay, rounded *up* to ``resolution_s``; ``None`` (the ladder) when
    not positive or beyond ``max_delay_s``."""
    if not remaining_s > 0 or not math.isfinite(remaining_s):
        return None
    # Microseconds first, so float noise (2.0000000001) does not cost a whole step.
    micros = round(remaining_s * 1_000_000)
    step = round(resolution_s * 1_000_000)
    rounded_us = -(-micros // step) * step
    if rounded_us > max_delay_s * 1_000_000:
        return None
    return -(-rounded_us // 1000)


def fixed_queue_prefix(prefix: str) -> str:
    """What every fixed queue of ladder prefix ``prefix`` is named with first."""
    return f"{prefix}.fixed."


def fixed_queue_name(spec: LadderSpec, dest: Destination, ttl_ms: int) -> str:
    """``<prefix>.fixed.<ttl>ms.<destination label>.<token>``: its exit queue's name, with the delay."""
    label = dest.exit_queue[len(f"{spec.prefix}.exit."):]
    return f"{fixed_queue_prefix(spec.prefix)}{ttl_ms}ms.{label}"


class FixedDelays:
    """The ``fixed`` backend: a :class:`~celery_delayq.typing.DelayBackend` over the ladder publisher."""

    #: What a message that goes through the ladder instead did not get (the log line).
    KIND = "a fixed queue"

    @classmethod
    def for_connection(cls, connection: Connection, config: DelayqConfig) -> "FixedDelays":
        """The process-wide instance of this class for a broker and configuration (over its ladder publisher)."""
        key = (cls, connection.as_uri(include_password=True), config)
        found = _FIXED.get(key, lambda: cls(publisher_for(connection, config)))
        assert isinstance(found, cls)
        return found

    def __init__(self, ladder: LadderPublisher) -> None:
        self.ladder = ladder
        self.config = ladder.config
        self._lock = threading.Lock()
        #: ``(exchange, routing key, ttl ms)`` -> queue name, declared in this process.
        self.queues: dict[tuple[str, str, int], str] = {}
        #: ``(reason, exchange, routing key)`` already logged.
        self._told: set[tuple[str, str, str]] = set()

    def after_fork_in_child(self) -> None:
        """In a forked child: a fresh lock (the queues declared stay declared)."""
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<FixedDelays {len(self.queues)} queue(s) over {self.ladder!r}>"

    # -- the backend contract -----------------------------------------------------
    def place(self, body: bytes | str, *, entry: str, due: float, delay: float, exchange: str, routing_key: str,
              headers: dict[str, Any], content_type: str | None = None, content_encoding: str | None = None,
              queue_hint: str | None = None, **properties: Any) -> tuple[LadderReceipt, dict[str, Any]]:
        """Into the fixed queue of the destination and delay, or, if it does not fit, the ladder."""
        return self.ladder.place_on(self._route, body, entry=entry, due=due, delay=delay, exchange=exchange,
                                    routing_key=routing_key, headers=headers, content_type=content_type,
                                    content_encoding=content_encoding, queue_hint=queue_hint, **properties)

    def confirming(self) -> ContextManager[None]:
        """The ladder publisher's: the same connection carries both."""
        return self.ladder.confirming()

    def worker_service(self, connection_for: Callable[[str], Connection], scheduling: Scheduling) -> LadderWorker:
        """The ladder's (the same one): declared, laps relayed (a delay that does not fit goes through it)."""
        return self.ladder.worker_service(connection_for, scheduling)

    # -- routing ------------------------------------------------------------------
    def _route(self, dest: Destination, due: float, now: float, shard: int) -> Route | tuple[int, str, str, int]:
        """``(units, exchange, routing key, hops)``: the fixed queue by the default exchange, or the ladder's."""
        spec = self.ladder.spec
        ttl = fixed_ttl_ms(due - now, resolution_s=self.config.fixed_resolution,
                           max_delay_s=self.config.fixed_max_delay)
        if ttl is None:
            self._tell("longer than delayq_fixed_max_delay", dest)
            return plan(spec, dest, due=due, now=now, shard=shard)
        queue = self._queue(dest, ttl)
        if queue is None:
            return plan(spec, dest, due=due, now=now, shard=shard)
        return spec.units_for(ttl / 1000), "", queue, 1

    def _queue(self, dest: Destination, ttl: int) -> str | None:
        key = (dest.exchange, dest.routing_key, ttl)
        with self._lock:
            name = self.queues.get(key)
            if name is not None:
                return name
            if len(self.queues) >= self.config.fixed_queues:
                self._tell(f"more than delayq_fixed_queues ({self.config.fixed_queues}) distinct delays", dest)
                return None
            name = fixed_queue_name(self.ladder.spec, dest, ttl)
            try:
                if not self._declare(name, dest, ttl):
                    self._tell(f"queue {name!r} does not exist and delayq_declare is False", dest)
                    return None
            except DelayqError as exc:  # FileHandleBudgetExceeded/Unknown: the ladder holds it instead
                self._tell(f"not declared ({exc})", dest)
                return None
            self.queues[key] = name
            return name

    def _declare(self, name: str, dest: Destination, ttl: int) -> bool:
        """Declare (or find) the queue; ``False`` when it is missing and may not be declared."""
        topology = self.ladder.topology
        assert topology is not None  # place_on connected and declared the ladder first
        raw: amqp.Connection = self.ladder.link.raw
        args = topology.fixed_queue_args(ttl, dest.exchange, dest.routing_key)
        ch = raw.channel()
        try:
            try:
                ch.queue_declare(name, passive=True)
                exists = True
            except amqp.NotFound:
                exists = False
                ch = raw.channel()
            if not exists and not self.config.declare:
                return False
            if not exists and topology.budget is not None and topology.queue_type == "quorum":
                topology.budget(name, 1, what="fixed-delay queue")  # RabbitMQ 3.x: a new quorum queue must fit the file handles
            if self.config.declare:  # also checks an existing queue's arguments (TopologyMismatch-like error)
                ch.queue_declare(name, durable=True, auto_delete=False, arguments=args)
            return True
        finally:
            if ch.is_open:
                ch.close()

    def _tell(self, reason: str, dest: Destination) -> None:
        key = (reason, dest.exchange, dest.routing_key)
        if key not in self._told:
            self._told.add(key)
            log.info("delayq: a delay for %r/%r goes through the ladder, not %s: %s",
                     dest.exchange, dest.routing_key, self.KIND, reason)


_FIXED: ProcessRegistry[FixedDelays] = ProcessRegistry()
