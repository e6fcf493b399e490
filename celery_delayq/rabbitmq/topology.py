"""Declare or verify the ladder on the broker; the only module that shapes topology.

Declaring is idempotent (workers at start, publishers before their first delayed publish);
``delayq_declare = False`` only verifies, reporting any difference by name.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Protocol, Sequence

import amqp
import tenacity

from ..errors import BrokerTooOld, TopologyError, TopologyMismatch, TopologyMissing, UnroutableDestination
from ..ladder.spec import LadderSpec, check_name, destination_token
from .client import broker_version, throwaway_channel

__all__ = ["Topology", "resolve_queue_type", "Destination", "EntityState", "LadderState",
           "Owned", "OwnedSelection", "ladder_role", "select_owned", "ROLES"]

log = logging.getLogger(__name__)

QUORUM_TTL_VERSION = (3, 10)


def resolve_queue_type(requested: str, version: tuple[int, ...]) -> str:
    """Pick ``quorum`` or ``classic`` for the ladder's queues.

    ``auto`` prefers quorum queues (crash-safe at-least-once dead-lettering; TTL needs
    RabbitMQ 3.10). Explicit ``quorum`` on an older broker is an error, not a downgrade.
    """
    if requested not in ("auto", "quorum", "classic"):
        raise ValueError(f"delayq_queue_type must be 'auto', 'quorum' or 'classic', got {requested!r}")
    if requested == "classic":
        return "classic"
    if version >= QUORUM_TTL_VERSION:
        return "quorum"
    shown = ".".join(map(str, version))
    if requested == "quorum":
        raise BrokerTooOld(
            f"RabbitMQ {shown} cannot expire messages in quorum queues (needs 3.10+). "
            "Upgrade the broker or set delayq_queue_type = 'classic'.")
    log.warning("RabbitMQ %s has no quorum-queue TTL; the ladder uses classic queues "
                "(dead-lettering is then at-most-once on a broker crash).", shown)
    return "classic"


@dataclass(frozen=True)
class Destination:
    """Where an undelayed publish would have gone, and the exit queue that restores it."""

    exchange: str
    routing_key: str
    token: str
    exit_queue: str


@dataclass(frozen=True)
class EntityState:
    """What a passive declare found for one exchange or queue.

    Attributes:
        kind: ``exchange`` or ``queue``.
        name: Its name.
        exists: Whether the broker has it.
        messages: Ready messages of a queue (``None`` for exchanges and absent queues);
            AMQP cannot see those a quorum queue holds in its dead-letter state.
        consumers: Consumers of a queue (``None`` likewise).
    """

    kind: str
    name: str
    exists: bool
    messages: int | None = None
    consumers: int | None = None


@dataclass(frozen=True)
class LadderState:
    """The result of :meth:`Topology.inspect`: every ladder entity, found or not.

    Attributes:
        entities: The ladder's exchanges and queues, then any extra queues asked for.
        namespace: The ladder's shape-specific name prefix (``LadderSpec.namespace``).
    """

    entities: tuple[EntityState, ...]
    namespace: str = ""

    @property
    def exists(self) -> bool:
        """Whether any part of *this* ladder is on the broker (not the prefix's shared unroutable ones)."""
        return any(e.exists and e.name.startswith(f"{self.namespace}.") for e in self.entities)

    @property
    def complete(self) -> bool:
        """Whether every part of the ladder is on the broker."""
        return all(e.exists for e in self.entities)

    @property
    def missing(self) -> list[EntityState]:
        """The entities the broker does not have."""
        return [e for e in self.entities if not e.exists]

    def missing_for_routing(self, spec: LadderSpec) -> list[EntityState]:
        """:attr:`missing` less the queues' entry exchanges, which only a ladder of 1.0.0rc1 or earlier lacks and
        which no message needs (its level exchanges route every publish: :meth:`Topology.verify`)."""
        entries = set(spec.entry_exchanges())
        return [e for e in self.missing if e.name not in entries]

    def queue(self, name: str) -> EntityState:
        """The state of queue ``name`` (KeyError if it is not part of the ladder)."""
        for e in self.entities:
            if e.kind == "queue" and e.name == name:
                return e
        raise KeyError(name)



#: The roles of what a ladder prefix puts on the broker, in the order ``topology delete`` reports them.
ROLES = ("levels", "entries", "delivery", "index", "cancels", "exit", "fixed", "buckets", "laps", "unroutable", "parking")

_SHAPE = r"(?P<shape>[1-9][0-9]*x[1-9][0-9]*)"
_LEVEL = r"(?:\.s[1-9][0-9]*)?\.L[0-9]{2,}"  # shard 0 has no .sN; L{k:02d}
_LABEL_TOKEN = r"[A-Za-z0-9_\-]{1,80}\.[0-9a-f]{16}"  # LadderSpec.exit_queue: readable label, then the token


@functools.lru_cache(maxsize=64)
def _patterns(prefix: str) -> tuple[tuple[str, str, re.Pattern[str]], ...]:
    """``(kind, role, pattern)`` of every name :class:`LadderSpec`, the index layout and the fixed and buckets
    backends make."""
    p = re.escape(prefix)
    rows = [
        ("queue", "levels", rf"{p}\.{_SHAPE}{_LEVEL}(?:\.d[1-9a-z])?"),  # radix 2: no .dN
        ("queue", "index", rf"{p}\.{_SHAPE}\.index\.[0-9a-f]{{2}}"),
        ("queue", "cancels", rf"{p}\.{_SHAPE}\.cancels"),
        ("queue", "exit", rf"{p}\.exit\.{_LABEL_TOKEN}"),
        ("queue", "fixed", rf"{p}\.fixed\.[0-9]+ms\.{_LABEL_TOKEN}"),
        ("queue", "buckets", rf"{p}\.bucket\.[0-9]+\.[0-9]+s\.[0-9]+\.(?:[0-9]+ms\.)?{_LABEL_TOKEN}"),
        ("queue", "laps", rf"{p}\.laps"),
        ("queue", "unroutable", rf"{p}\.unroutable"),
        ("queue", "parking", rf"{p}\.parking"),
        ("exchange", "levels", rf"{p}\.{_SHAPE}{_LEVEL}"),
        ("exchange", "entries", rf"{p}\.{_SHAPE}{_LEVEL}(?:\.d[1-9a-z])?\.entry"),  # a level queue's own fanout
        ("exchange", "delivery", rf"{p}\.{_SHAPE}\.deliver"),
        ("exchange", "unroutable", rf"{p}\.unroutable"),
    ]
    return tuple((kind, role, re.compile(pattern)) for kind, role, pattern in rows)


def ladder_role(prefix: str, kind: str, name: str, *, parking_queue: str | None = None) -> tuple[str, str] | None:
    """``(role, shape)`` of a broker entity that ladder prefix ``prefix`` made, else ``None`` (pure).

    Only names the ladder's naming scheme produces match, never another app's queue that
    merely shares the prefix. ``shape`` is ``"LEVELSxRADIX"``, or ``""`` for what every shape shares (exit,
    fixed, buckets, laps, unroutable, parking). ``parking_queue``: the app's, when it lies outside the prefix.
    """
    if kind == "queue" and parking_queue and name == parking_queue:
        return "parking", ""
    for pattern_kind, role, pattern in _patterns(prefix):
        if pattern_kind == kind:
            found = pattern.fullmatch(name)
            if found:
                return role, found.groupdict().get("shape") or ""
    return None


@dataclass(frozen=True)
class Owned:
    """One exchange or queue on the broker that a ladder prefix made (see :func:`ladder_role`).

    Attributes:
        kind: ``exchange`` or ``queue``.
        name: Its name.
        role: One of :data:`ROLES`.
        shape: ``"LEVELSxRADIX"`` of the ladder it belongs to; ``""`` when every shape shares it.
        messages: Messages a queue holds, as last counted (``None``: exchanges, or not counted).
        stream: Whether the queue is a stream (its messages are history, never waiting work).
    """

    kind: str
    name: str
    role: str
    shape: str = ""
    messages: int | None = None
    stream: bool = False


@dataclass(frozen=True)
class OwnedSelection:
    """What :func:`select_owned` picked from a broker's listing.

    Attributes:
        delete: What to delete: the app's ladder and, unless kept, what the prefix's shapes share.
        kept: What the prefix shares that stays (``--keep-shared``; another shape still uses it;
            the parking queue unless asked for).
        other_shapes: The ladders of the prefix's other shapes (never deleted by another shape's app).
    """

    delete: tuple[Owned, ...]
    kept: tuple[Owned, ...]
    other_shapes: tuple[Owned, ...]


def select_owned(spec: LadderSpec, queues: Iterable[Mapping[str, Any]], exchanges: Iterable[Mapping[str, Any]], *,
                 parking_queue: str | None = None, with_parking: bool = False,
                 keep_shared: bool = False) -> OwnedSelection:
    """Pick the ladder's entities out of the broker's management-API listing of a vhost (pure).

    The app's shape goes in every shard the broker has. What the prefix's shapes share goes
    too, unless ``keep_shared`` or only another shape is there; parking only ``with_parking``.
    """
    shape = f"{spec.levels}x{spec.radix}"
    found: list[Owned] = []
    for kind, rows in (("queue", queues), ("exchange", exchanges)):
        for row in rows:
            name = str(row.get("name", ""))
            role = ladder_role(spec.prefix, kind, name, parking_queue=parking_queue)
            if role is None:
                continue
            stream = kind == "queue" and row.get("type") == "stream"
            count = row.get("messages")
            messages = count if kind == "queue" and isinstance(count, int) and not isinstance(count, bool) else None
            found.append(Owned(kind, name, role[0], role[1], messages, stream))
    found.sort(key=lambda o: (o.kind != "queue", ROLES.index(o.role), o.name))
    own = [o for o in found if o.shape == shape]
    others = [o for o in found if o.shape and o.shape != shape]
    shared = [o for o in found if not o.shape]
    go_shared = not keep_shared and (bool(own) or not others)
    delete = own + [o for o in shared if go_shared and (o.role != "parking" or with_parking)]
    kept = [o for o in shared if o not in delete]
    return OwnedSelection(tuple(delete), tuple(kept), tuple(others))


class QueueBudget(Protocol):
    """Raises unless ``quorum_queues`` new quorum queues fit the broker (:class:`~.budget.BudgetCheck`)."""

    def __call__(self, namespace: str, quorum_queues: int, *, what: str = "ladder") -> None: ...

@dataclass
class Topology:
    """The ladder's exchanges, queues and bindings for one :class:`LadderSpec`.

    Attributes:
        spec: The ladder's shape and names.
        queue_type: ``quorum`` or ``classic`` (already resolved).
    """

    spec: LadderSpec
    queue_type: str
    _exits: dict[tuple[str, str], Destination] = field(default_factory=dict, repr=False)
    #: ``(exchange, routing_key) -> routes?`` (``None``: cannot tell), e.g.
    #: :meth:`~celery_delayq.rabbitmq.management.ManagementAPI.routes`; used where AMQP cannot tell.
    route_check: Callable[[str, str], bool | None] | None = field(default=None, repr=False)
    #: The streams of the index of waiting tasks and of the cancel log
    #: (:class:`~celery_delayq.ladder.index_layout.IndexLayout`); ``None`` = none.
    index: Any = field(default=None, repr=False)
    #: Declares every queue a *new* ladder owns on the node that should lead it
    #: (:meth:`~celery_delayq.rabbitmq.placement.LeaderPlacement.place`), and a new exit queue on the node
    #: that leads the fewest queues (``balance=True``); ``None`` = wherever the broker puts them.
    placement: Callable[..., dict[str, str]] | None = field(default=None, repr=False)
    #: Raises unless ``(namespace, quorum queues to add)`` of a *new* ladder fit the broker's
    #: file-handle budget (:class:`~celery_delayq.rabbitmq.budget.BudgetCheck`, RabbitMQ 3.x); ``None`` = no check.
    budget: QueueBudget | None = field(default=None, repr=False)
    _streams_on: Any = field(default=None, repr=False)

    # -- arguments ----------------------------------------------------------
    def _queue_args(self, ttl_ms: int, dlx: str, dl_routing_key: str | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {
            "x-queue-type": self.queue_type,
            "x-message-ttl": ttl_ms,
            "x-dead-letter-exchange": dlx,
        }
        if dl_routing_key is not None:
            args["x-dead-letter-routing-key"] = dl_routing_key
        if self.queue_type == "quorum":
            # At-least-once dead-lettering needs reject-publish overflow; without it a
            # broker crash between expiry and the next level's enqueue loses the message.
            args["x-dead-letter-strategy"] = "at-least-once"
            args["x-overflow"] = "reject-publish"
        return args

    def level_queue_args(self, k: int, digit: int, shard: int = 0) -> dict[str, Any]:
        """Arguments of ladder queue ``(k, digit)`` of shard ``shard``."""
        return self._queue_args(self.spec.queue_ttl_ms(k, digit), self.spec.dead_letter_target(k, shard))

    def exit_queue_args(self, exchange: str, routing_key: str) -> dict[str, Any]:
        """Arguments of an exit queue: expire at once into the original exchange and key."""
        return self._queue_args(0, exchange, routing_key)

    def fixed_queue_args(self, ttl_ms: int, exchange: str, routing_key: str) -> dict[str, Any]:
        """Arguments of a ``fixed`` backend queue: an exit queue's, waiting ``ttl_ms`` (:mod:`.fixed`)."""
        return self._queue_args(ttl_ms, exchange, routing_key)

    def bucket_queue_args(self, lease_ms: int, exchange: str, routing_key: str) -> dict[str, Any]:
        """Arguments of a due-time bucket (:mod:`.buckets`): a ``fixed`` queue's whose messages carry their own
        TTL, deleting itself ``lease_ms`` after it was created (a redeclare does not renew a quorum queue's)."""
        return {**self._queue_args(lease_ms, exchange, routing_key), "x-expires": lease_ms}

    def entities(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every entity as ``(kind, name, args)`` in declaration order (targets first)."""
        s = self.spec
        plan: list[tuple[str, str, dict[str, Any]]] = [
            ("exchange:fanout", s.unroutable_exchange, {}),
            ("queue", s.unroutable_queue, {"x-queue-type": self.queue_type}),
            ("exchange:topic", s.delivery_exchange, {"alternate-exchange": s.unroutable_exchange}),
            # Classic: a relay that fails hands the message back, and on RabbitMQ 4.x every
            # return to a quorum queue counts towards its delivery limit (20).
            ("queue", s.laps_queue, {"x-queue-type": "classic"}),
        ]
        plan += [("exchange:topic", name, {}) for name in s.level_exchanges()]
        plan += [("exchange:fanout", name, {}) for name in s.entry_exchanges()]
        plan += [("queue", q.name, self.level_queue_args(q.level, q.digit, q.shard)) for q in s.level_queues()]
        if self.index is not None:
            plan += self.index.entities()
        return plan

    # -- declare -------------------------------------------------------------
    def declare(self, connection: amqp.Connection, *, defer_streams: bool = False) -> None:
        """Create the whole ladder; a no-op where it already exists as specified.

        ``defer_streams`` leaves the index and cancel-log streams for :meth:`streams_ready`, so
        a first delayed publish need not wait for them. Declares are pipelined (``nowait``) and
        end in one synchronous call, where a refusal surfaces as :class:`TopologyMismatch`.
        """
        s = self.spec
        streams = set(self.index.streams) if self.index is not None else set()
        asking = self.queue_type == "quorum" and (self.placement is not None or self.budget is not None)
        missing = self.missing_quorum_queues(connection) if asking else []
        if missing and self.budget is not None:
            self.budget(s.namespace, len(missing))  # FileHandleBudgetExceeded/Unknown: nothing created
        if missing and self.placement is not None:
            self._place(connection)
        for attempt in _racing_declares():
            with attempt, throwaway_channel(connection) as ch, _mismatch("the ladder"):
                for kind, name, args in self.entities():
                    if name not in streams and name != s.laps_queue:
                        _declare(ch, kind, name, args, nowait=True)
                ch.queue_bind(s.unroutable_queue, s.unroutable_exchange, "", nowait=True)
                for b in s.bindings():
                    if b.destination_kind == "queue":
                        ch.queue_bind(b.destination, b.source, b.routing_key, nowait=True)
                    else:
                        ch.exchange_bind(b.destination, b.source, b.routing_key, nowait=True)
                # The barrier: replies come in order, so once this one is back every
                # declare above has been applied (or the channel was closed with why).
                ch.exchange_declare(s.delivery_exchange, "topic", passive=True)
        self._declare_laps_queue(connection)
        # The index and cancel-log streams come after the ladder, so they never slow it down.
        self._streams_on = connection if self.index is not None else None
        if not defer_streams:
            self.streams_ready()

    def _declare_laps_queue(self, connection: amqp.Connection) -> None:
        """The laps queue, on a channel of its own: an existing one whose node is down is no reason to stop.

        It is classic (see :meth:`entities`), so it lives on one node; while that node is down or restarting its
        declare answers 404, which in one pipeline with the rest stopped every worker and new publishing process
        (docs/clusters.md). Laps ending meanwhile wait in their exit queue; the relay consumes again once it is back.
        """
        name = self.spec.laps_queue
        try:
            for attempt in _racing_declares():
                with attempt, throwaway_channel(connection) as ch, _mismatch(f"the laps queue {name}"):
                    _declare(ch, "queue", name, {"x-queue-type": "classic"})
        except amqp.NotFound as exc:
            if not _not_found(exc, _UNAVAILABLE):
                raise
            log.warning("delayq: the laps queue %s is unavailable (%s): its node is down or restarting. Delays "
                        "longer than the ladder wait until it is back; everything else goes on.", name,
                        getattr(exc, "reply_text", exc))

    def missing_quorum_queues(self, connection: amqp.Connection) -> list[str]:
        """The ladder's quorum queues (levels, unroutable) a declare would add; ``[]`` for an existing ladder.

        One passive declare tells; a new (or growing) ladder counts all of them, erring safe.
        """
        s = self.spec
        with _Channels(connection) as chans:
            # The last shard's: a ladder that gains shards has missing queues.
            if _probe(chans, "queue", s.level_queue(s.levels - 1, s.radix - 1, s.shards - 1)).exists:
                return []
        return [q.name for q in s.level_queues()] + [s.unroutable_queue]

    def owned_queues(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(kind, name, args)`` of every queue the ladder owns, in placement order (pure; no exit/parking queues)."""
        s = self.spec
        out: list[tuple[str, str, dict[str, Any]]] = [
            ("levels", q.name, self.level_queue_args(q.level, q.digit, q.shard)) for q in s.level_queues()]
        out.append(("unroutable", s.unroutable_queue, {"x-queue-type": self.queue_type}))
        out.append(("laps", s.laps_queue, {"x-queue-type": "classic"}))
        if self.index is not None:
            cancel = self.index.cancel_queue
            out += [("cancels" if name == cancel else "index", name, args) for _kind, name, args in self.index.entities()]
        return out

    def _place(self, connection: amqp.Connection) -> None:
        """A new ladder gets every queue it owns declared on its leader's node first (round robin per kind)."""
        assert self.placement is not None
        s = self.spec
        # The exchanges first: a quorum queue's at-least-once dead-letter worker that starts
        # without its target exchange holds what expires until a 180 s timer (RabbitMQ < 4.3).
        with throwaway_channel(connection) as ch, _mismatch("the ladder's exchanges"):
            for kind, name, args in self.entities():
                if kind.startswith("exchange"):
                    _declare(ch, kind, name, args, nowait=True)
            ch.exchange_declare(s.delivery_exchange, "topic", passive=True)  # the barrier
        with _mismatch("the ladder"):
            self.placement([(name, args) for _kind, name, args in self.owned_queues()])

    def streams_ready(self, connection: amqp.Connection | None = None) -> None:
        """Create the streams a deferred :meth:`declare` left out (on ``connection``, default its own)."""
        declared_on, self._streams_on = self._streams_on, None
        if declared_on is None:
            return
        with throwaway_channel(connection or declared_on) as ch, _mismatch("the index streams"):
            for kind, name, args in self.index.entities():
                _declare(ch, kind, name, args, nowait=True)
            ch.queue_declare(self.index.cancel_queue, passive=True)  # the barrier

    def verify(self, connection: amqp.Connection) -> Literal["fanout", "topic"]:
        """Check that the ladder exists with the expected arguments, creating nothing; return how to enter it.

        A ladder declared by 1.0.0rc1 or earlier has every queue and binding but not the queues' entry
        exchanges (:meth:`LadderSpec.entry_exchange_of`): that is not an error, since its level exchanges still
        route every publish; the answer is ``"topic"`` (publish through them, as that release did, logged once)
        until ``delayq topology declare`` adds the entries. Otherwise ``"fanout"``.

        Raises:
            TopologyMissing: naming every missing exchange and queue.
            TopologyMismatch: naming the entity and argument that differ.
        """
        with _Channels(connection) as chans:
            state = LadderState(tuple(_probe(chans, kind.split(":")[0], name)
                                      for kind, name, _args in self.entities()), self.spec.namespace)
            missing = [f"{e.kind} {e.name!r}" for e in state.missing_for_routing(self.spec)]
            if missing:
                raise TopologyMissing(
                    f"the delayq ladder is incomplete on the broker; missing: {', '.join(missing)}. "
                    "Run `celery -A APP delayq topology declare` with a user that may configure, "
                    "or set delayq_declare = True.")
            absent = {e.name for e in state.missing}  # entry exchanges only, by now
            how: Literal["fanout", "topic"] = "topic" if absent else "fanout"
            if how == "topic":
                log.warning("delayq: the ladder %s has no entry exchanges (declared by celery_delayq 1.0.0rc1 or "
                            "earlier): publishing through its level exchanges, as that release did. Run `celery -A "
                            "APP delayq topology declare` (or apply a new export) for the faster entry.",
                            self.spec.namespace)
            # Redeclaring with the same arguments changes nothing but fails with 406
            # (PRECONDITION_FAILED) naming the argument that differs. What is absent is not declared:
            # verifying creates nothing.
            for kind, name, args in self.entities():
                if name in absent:
                    continue
                try:
                    with _mismatch(f"{kind.split(':')[0]} {name!r}"):
                        chans.call(lambda ch: _declare(ch, kind, name, args))  # called at once
                except amqp.AccessRefused:
                    log.info("delayq: no configure permission; ladder arguments not verified")
                    break
        return how

    def inspect(self, connection: amqp.Connection, *, extra_queues: list[str] | tuple[str, ...] = ()) -> LadderState:
        """Which ladder exchanges and queues (and ``extra_queues``) exist, and their messages.

        Passive declares only: creates nothing, needs no configure permission.
        """
        wanted = [(kind.split(":")[0], name) for kind, name, _args in self.entities()]
        wanted += [("queue", name) for name in extra_queues]
        with _Channels(connection) as chans:
            found = [_probe(chans, kind, name) for kind, name in wanted]
        if self.index is not None:  # a stream's history is not messages waiting
            streams = set(self.index.streams)
            found = [EntityState(e.kind, e.name, e.exists, 0 if e.exists else None, e.consumers)
                     if e.name in streams else e for e in found]
        return LadderState(tuple(found), self.spec.namespace)

    def delete(self, connection: amqp.Connection, *, if_empty: bool = True,
               exit_queues: list[str] | tuple[str, ...] = (), keep_shared: bool = False) -> list[str]:
        """Delete the ladder and the named exit queues (what the configuration names); returns what was deleted.

        Only what exists is deleted. With ``if_empty`` nothing at all is deleted while any queue
        holds messages (:class:`TopologyError` names them). ``keep_shared`` keeps what every
        shape of the prefix shares. ``delayq topology delete`` uses :meth:`delete_listed`.
        """
        s = self.spec
        queues = [q.name for q in s.level_queues()] + ([] if keep_shared else [s.unroutable_queue, s.laps_queue])
        queues += list(exit_queues) + [d.exit_queue for d in self._exits.values()]
        if not keep_shared:  # the laps queue's own exit queue goes with it
            queues.append(self.destination("", s.laps_queue).exit_queue)
        exchanges = s.entry_exchanges() + s.level_exchanges() + [s.delivery_exchange]
        exchanges += [] if keep_shared else [s.unroutable_exchange]
        streams = self.index.streams if self.index is not None else []
        queues += streams
        deleted = _delete_named(connection, list(dict.fromkeys(queues)), exchanges, streams=set(streams),
                                if_empty=if_empty)
        self._exits.clear()
        return deleted

    # -- delete what the broker lists -------------------------------------------
    def look(self, connection: amqp.Connection, owned: Sequence[Owned]) -> list[Owned]:
        """``owned`` as the broker has it now: what is gone dropped, each queue's messages counted again.

        The larger of the listing's count (includes held messages, lags up to 5 s) and a passive
        declare's (exact, ready only); streams count ``0``.
        """
        out: list[Owned] = []
        with _Channels(connection) as chans:
            for o in owned:
                state = _probe(chans, o.kind, o.name)
                if not state.exists:
                    continue
                if o.kind == "queue":
                    now = 0 if o.stream else max(o.messages or 0, state.messages or 0)
                    o = Owned(o.kind, o.name, o.role, o.shape, now, o.stream)
                out.append(o)
        return out

    def delete_listed(self, connection: amqp.Connection, owned: Sequence[Owned], *, if_empty: bool = True) -> list[str]:
        """Delete the entities of a broker listing (:func:`select_owned`), queues first; as :meth:`delete`."""
        busy = {o.name for o in owned if o.kind == "queue" and o.messages and not o.stream}
        deleted = _delete_named(connection, [o.name for o in owned if o.kind == "queue"],
                                [o.name for o in owned if o.kind == "exchange"],
                                streams={o.name for o in owned if o.stream}, if_empty=if_empty, busy=busy)
        self._exits.clear()
        return deleted

    # -- exits -------------------------------------------------------------------
    def destination(self, exchange: str, routing_key: str) -> Destination:
        """The :class:`Destination` for an exchange and routing key (pure, cached)."""
        key = (exchange, routing_key)
        dest = self._exits.get(key)
        if dest is None:
            check_name("exchange name", exchange)
            check_name("routing key", routing_key)
            token = destination_token(exchange, routing_key)
            label = f"{exchange or 'default'}.{routing_key}"
            dest = Destination(exchange, routing_key, token, self.spec.exit_queue(label, token))
        return dest

    def ensured(self, exchange: str, routing_key: str) -> Destination | None:
        """The destination if :meth:`ensure_exit` already checked it in this process, else ``None`` (no broker call)."""
        return self._exits.get((exchange, routing_key))

    def _check_route(self, dest: Destination) -> None:
        """Refuse a key the exchange routes nowhere (an exit queue would hold it for ever); asks the management API."""
        routes = self.route_check(dest.exchange, dest.routing_key) if self.route_check else None
        if routes is False:
            raise UnroutableDestination(
                f"cannot delay a message to exchange {dest.exchange!r} with routing key "
                f"{dest.routing_key!r}: no binding of that exchange routes this key, so the message "
                "could never be delivered. Bind a queue for it, or publish to a queue Celery "
                "declares (apply_async(queue=...)).")
        if routes is None:
            log.warning("delayq: cannot check that exchange %r routes key %r (RabbitMQ's management API "
                        "is not reachable; set delayq_management_url). If it does not, messages for it "
                        "wait in exit queue %r until a binding appears.",
                        dest.exchange, dest.routing_key, dest.exit_queue)

    def ensure_exit(self, connection: amqp.Connection, dest: Destination, *,
                    declare: bool, queue_hint: str | None = None) -> None:
        """Make sure the destination exists and its exit queue is bound (once per process and destination)."""
        key = (dest.exchange, dest.routing_key)
        if key in self._exits:
            return
        with _Channels(connection) as chans:
            try:
                if dest.exchange == "":
                    chans.call(lambda ch: ch.queue_declare(dest.routing_key, passive=True))
                else:
                    chans.call(lambda ch: ch.exchange_declare(dest.exchange, "direct", passive=True))
                    if queue_hint:
                        chans.call(lambda ch: ch.queue_declare(queue_hint, passive=True))
            except amqp.NotFound as exc:
                raise UnroutableDestination(
                    f"cannot delay a message to exchange {dest.exchange!r} with routing key "
                    f"{dest.routing_key!r}: {exc.reply_text}. Declare the destination first "
                    "(Celery does this for queues in task_queues/task_create_missing_queues).") from None
            if dest.exchange and not queue_hint:
                self._check_route(dest)
            args = self.exit_queue_args(dest.exchange, dest.routing_key)
            if declare:
                if self.placement is not None and self.queue_type == "quorum" \
                        and not _probe(chans, "queue", dest.exit_queue).exists:
                    # a new exit queue leads where the fewest queues do, not on this connection's node
                    with _mismatch(f"exit queue {dest.exit_queue}"):
                        self.placement([(dest.exit_queue, args)], balance=True)
                for attempt in _racing_declares():
                    with attempt, _mismatch(f"exit queue {dest.exit_queue}"):
                        chans.call(lambda ch: _declare(ch, "queue", dest.exit_queue, args))
                with _mismatch("exit binding"):
                    chans.call(lambda ch: ch.queue_bind(
                        dest.exit_queue, self.spec.delivery_exchange, self.spec.exit_binding_key(dest.token)))
            elif not _probe(chans, "queue", dest.exit_queue).exists:
                raise TopologyMissing(
                    f"exit queue {dest.exit_queue!r} for exchange {dest.exchange!r} / routing key "
                    f"{dest.routing_key!r} does not exist and delayq_declare is False. Declare it with "
                    "`celery -A APP delayq topology declare --destination EXCHANGE:ROUTING_KEY`.")
        self._exits[key] = dest


def _delete_named(connection: amqp.Connection, queues: Sequence[str], exchanges: Sequence[str], *,
                  streams: set[str], if_empty: bool, busy: Iterable[str] = ()) -> list[str]:
    """Delete the queues, then the exchanges, that exist; refuse first if ``if_empty`` and any holds messages.

    ``busy``: queues holding messages a passive declare cannot see.
    """
    deleted: list[str] = []
    busy = set(busy)
    with _Channels(connection) as chans:
        found = [_probe(chans, "queue", name) for name in queues]
        held = [f"{q.name} ({q.messages})" for q in found
                if q.exists and q.name not in streams and (q.messages or q.name in busy)]
        if if_empty and held:
            raise TopologyError(f"{len(held)} ladder queue(s) still hold messages: {', '.join(held)}; "
                                "nothing was deleted. Wait until they drain, or delete with "
                                "if_empty=False (CLI: --discard-messages) to drop them.")
        for q in found:
            if q.exists:
                # Quorum queues refuse queue.delete(if_empty=True) with a *connection*
                # error, so the depth was looked at above instead.
                chans.call(lambda ch: ch.queue_delete(q.name))
                deleted.append(f"queue {q.name}")
        for name in exchanges:
            # exchange.delete succeeds for an absent exchange, so look first.
            if _probe(chans, "exchange", name).exists:
                chans.call(lambda ch: ch.exchange_delete(name))
                deleted.append(f"exchange {name}")
    return deleted


#: RabbitMQ 4.x's 404 'home node … is down or inaccessible': another declare is still starting the queue.
_STARTING_ELSEWHERE = ("down or inaccessible",)
#: A 404 for a queue that exists but whose process is not running: its (classic) node is down or stopping.
_UNAVAILABLE = (*_STARTING_ELSEWHERE, "stopped by supervisor", "due to timeout")


def _not_found(exc: BaseException, signs: tuple[str, ...]) -> bool:
    """A 404 (``amqp.NotFound``) whose text names one of ``signs``."""
    return isinstance(exc, amqp.NotFound) and any(sign in str(getattr(exc, "reply_text", exc)) for sign in signs)


def _racing_declares() -> tenacity.Retrying:
    """Attempts for a declare that may race another process's first declare (up to ~15 s)."""
    return tenacity.Retrying(retry=tenacity.retry_if_exception(lambda exc: _not_found(exc, _STARTING_ELSEWHERE)),
                             wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
                             stop=tenacity.stop_after_delay(15.0), reraise=True)


def _declare(ch: amqp.Channel, kind: str, name: str, args: dict[str, Any], nowait: bool = False) -> None:
    if kind.startswith("exchange"):
        ch.exchange_declare(name, kind.split(":")[1], durable=True, auto_delete=False, arguments=args or None,
                            nowait=nowait)
    else:
        ch.queue_declare(name, durable=True, auto_delete=False, arguments=args or None, nowait=nowait)


def _probe(chans: "_Channels", kind: str, name: str) -> EntityState:
    """Passive declare of one exchange or queue."""
    try:
        if kind == "exchange":
            chans.call(lambda ch: ch.exchange_declare(name, "topic", passive=True))
            return EntityState(kind, name, True)
        ok = chans.call(lambda ch: ch.queue_declare(name, passive=True))
        return EntityState(kind, name, True, int(ok.message_count), int(ok.consumer_count))
    except amqp.NotFound:
        return EntityState(kind, name, False)


class _Channels:
    """A channel that is reopened after the broker closes it on a soft error."""

    def __init__(self, connection: amqp.Connection) -> None:
        self.connection = connection
        self.channel: amqp.Channel | None = None

    def __enter__(self) -> "_Channels":
        self.channel = self.connection.channel()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.channel is not None and self.channel.is_open:
            self.channel.close()

    def call(self, fn: Callable[[amqp.Channel], Any]) -> Any:
        assert self.channel is not None
        if not self.channel.is_open:
            self.channel = self.connection.channel()
        try:
            return fn(self.channel)
        except amqp.ChannelError:
            self.channel = self.connection.channel()
            raise


@contextlib.contextmanager
def _mismatch(what: str) -> Iterator[None]:
    """Turn the broker's PRECONDITION_FAILED (``what`` exists with other arguments) into :class:`TopologyMismatch`."""
    try:
        yield
    except amqp.PreconditionFailed as exc:
        raise TopologyMismatch(
            f"{what} exists on the broker with other arguments than this app expects: "
            f"{exc.reply_text}. This happens when delayq_unit_ms, delayq_levels, delayq_radix "
            "or delayq_queue_type changed: delete the old ladder (`celery -A APP delayq topology "
            "delete`) once it is empty, or use a new delayq_prefix.") from None
