"""Pure arithmetic of the TTL-queue ladder: no I/O, no Celery.

Level ``k`` is a topic exchange plus ``radix - 1`` queues, queue ``(k, d)`` waiting ``d * radix**k`` units; a
delay's base-``radix`` digits are the routing key's first words, so a message waits exactly its delay, one queue
per non-zero digit, then its destination's exit queue republishes it. A publish enters through its first
queue's own fanout exchange (the key is kept, not matched); every later hop is routed by the level exchanges.
The full picture: docs/how-it-works.md.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Literal, NamedTuple

from ..errors import DelayTooLong, InvalidDelay, InvalidName

__all__ = ["LadderSpec", "Binding", "LevelQueue", "destination_token", "check_name", "MAX_NAME_BYTES", "MAX_SHARDS"]

#: RabbitMQ limit for queue names, exchange names and routing keys (shortstr).
MAX_NAME_BYTES = 255
#: Hex digits of the destination token; 64 bits makes collisions irrelevant.
TOKEN_LENGTH = 16
#: Most ladder shards one spec may have (each is ``levels * (radix - 1)`` more queues).
MAX_SHARDS = 64


def check_name(kind: str, name: str) -> str:
    """Return ``name`` or raise :class:`InvalidName` if RabbitMQ would reject it."""
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise InvalidName(
            f"{kind} {name[:40]!r}... is {size} bytes long; RabbitMQ allows at most "
            f"{MAX_NAME_BYTES} bytes. Use a shorter name.")
    return name


def destination_token(exchange: str, routing_key: str) -> str:
    """A fixed-size, wildcard-free routing-key word that identifies a destination.

    Hashing keeps the ladder routing key short whatever the destination's own routing key is, and keeps
    ``*``/``#`` in it from acting as wildcards in the delivery exchange's bindings.
    """
    digest = hashlib.sha256(f"{exchange}\x00{routing_key}".encode("utf-8")).hexdigest()
    return digest[:TOKEN_LENGTH]


@dataclass(frozen=True)
class Binding:
    """One binding of the ladder topology (``source`` exchange to a queue or exchange)."""

    source: str
    destination: str
    destination_kind: Literal["queue", "exchange"]
    routing_key: str


class LevelQueue(NamedTuple):
    """One waiting queue of the ladder: level ``level``, digit ``digit``, of shard ``shard``."""

    level: int
    digit: int
    name: str
    shard: int = 0


_READABLE = re.compile(r"[^A-Za-z0-9_\-]+")


@dataclass(frozen=True)
class LadderSpec:
    """Shape and names of one ladder. Immutable, hashable and cheap to build.

    Attributes:
        prefix: Namespace of every exchange and queue of the ladder. It must not be ``celery_delayed`` so the
            ladder never clashes with Celery's own native delayed-delivery topology.
        unit_ms: The resolution: level 0 waits one unit. Integer milliseconds, because that is what
            ``x-message-ttl`` takes.
        levels: Number of digits (levels). The maximum delay is ``(radix**levels - 1) * unit_ms``.
        radix: Digit base; 2 is the classic binary ladder. A higher radix cuts the hops per message at the price
            of ``radix - 1`` queues per level (the default's measurements: docs/how-it-works.md).
        shards: Parallel copies of the levels (exchanges and queues); each message takes the one its id hashes
            to (:meth:`shard_of`), so that the broker's per-queue dead-letter work spreads over more queues, and
            so over a cluster's nodes and a node's cores. Shard 0 keeps the unsharded names, so 1 (the default)
            is the ladder as it always was, and a ladder can gain shards while messages wait in it. All shards
            share the delivery exchange and the exit queues.
        entries: How a publish enters the ladder. ``"fanout"`` (the default): through the fanout exchange of the
            first queue it waits in (:meth:`entry_exchange_of`), which routes without matching the 15-word key,
            so the broker confirms it sooner (docs/benchmarks.md, "The entry exchange"); the key travels on for
            the later hops. ``"topic"``: through that queue's level exchange, as 1.0.0rc1 and earlier did, for a
            ladder an older release declared and this process may not extend (``delayq_declare = False``). Not
            part of the ladder's identity: both enter the same queues.
    """

    prefix: str = "delayq"
    unit_ms: int = 10
    levels: int = 14
    radix: int = 4
    shards: int = 1
    entries: Literal["fanout", "topic"] = field(default="fanout", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.unit_ms, int) or self.unit_ms < 1:
            raise ValueError(f"unit_ms must be a positive integer of milliseconds, got {self.unit_ms!r}")
        if not isinstance(self.radix, int) or not 2 <= self.radix <= 36:
            raise ValueError(f"radix must be an integer from 2 to 36, got {self.radix!r}")
        if not isinstance(self.levels, int) or self.levels < 1:
            raise ValueError(f"levels must be a positive integer, got {self.levels!r}")
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or not 1 <= self.shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an integer from 1 to {MAX_SHARDS}, got {self.shards!r}")
        if self.entries not in ("fanout", "topic"):
            raise ValueError(f"entries must be 'fanout' or 'topic', got {self.entries!r}")
        if not self.prefix or self.prefix.startswith("celery_delayed"):
            raise ValueError(
                f"prefix {self.prefix!r} is empty or clashes with Celery's native "
                "'celery_delayed_*' topology; choose another prefix")
        # The longest name and routing key must fit RabbitMQ's limits.
        check_name("ladder routing key", self.routing_key(0, "0" * TOKEN_LENGTH))
        check_name("ladder queue name", self.exit_queue("x" * 80, "0" * TOKEN_LENGTH))
        if self.max_ttl_ms > 2**32 - 1:
            raise ValueError(
                f"the top level's TTL of {self.max_ttl_ms} ms exceeds the {2**32 - 1} ms that "
                "RabbitMQ's (Erlang) expiry timers can wait; use fewer levels or a smaller unit")

    # -- sizes ------------------------------------------------------------
    @functools.cached_property  # asked on every publish; the spec is immutable
    def max_units(self) -> int:
        """Largest delay the ladder holds, in units."""
        return int(self.radix**self.levels) - 1  # int ** int is typed Any (a negative power is a float)

    @functools.cached_property
    def max_delay_s(self) -> float:
        """Largest delay the ladder holds, in seconds."""
        return self.max_units * self.unit_ms / 1000.0

    @property
    def max_ttl_ms(self) -> int:
        """TTL of the longest-waiting queue (top level, highest digit)."""
        return (self.radix - 1) * int(self.radix ** (self.levels - 1)) * self.unit_ms

    # -- delay -> units -> digits -----------------------------------------
    def units_for(self, delay_s: float) -> int:
        """Units to wait for ``delay_s`` seconds, rounded *up* so delivery is never early.

        Raises:
            InvalidDelay: for NaN, infinities and non-numbers.
            DelayTooLong: beyond :attr:`max_delay_s`; the delay is never truncated.
        """
        if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)):
            raise InvalidDelay(f"delay must be a number of seconds, got {delay_s!r}")
        if math.isnan(delay_s) or math.isinf(delay_s):
            raise InvalidDelay(f"delay must be a finite number of seconds, got {delay_s!r}")
        if delay_s <= 0:
            return 0
        # Round to the microsecond first so float noise such as 0.30000000000000004 s
        # does not cost a whole extra unit, then round up to whole units.
        micros = round(delay_s * 1_000_000)
        unit_us = self.unit_ms * 1000
        units = -(-micros // unit_us)
        if units > self.max_units:
            raise DelayTooLong(
                f"a delay of {delay_s:.3f} s exceeds this ladder's maximum of {self.max_delay_s:.3f} s "
                f"({self.levels} levels of radix {self.radix}, unit {self.unit_ms} ms). Raise "
                "delayq_levels or delayq_unit_ms; celery_delayq never truncates a delay.")
        return units

    def digits(self, units: int) -> tuple[int, ...]:
        """The ``levels`` base-``radix`` digits of ``units``, most significant first."""
        if not 0 <= units <= self.max_units:
            raise DelayTooLong(f"{units} units is outside 0..{self.max_units}")
        out = [0] * self.levels
        for i in range(self.levels - 1, -1, -1):
            units, out[i] = divmod(units, self.radix)
        return tuple(out)

    def delay_of(self, routing_key: str) -> int:
        """Units encoded in a ladder routing key (the inverse of :meth:`routing_key`)."""
        words = routing_key.split(".")[: self.levels]
        value = 0
        for word in words:
            value = value * self.radix + int(word, self.radix)
        return value

    def routing_key(self, units: int, token: str) -> str:
        """Ladder routing key: the digits, most significant first, then the destination token."""
        return self._key_of(self.digits(units), token)

    def shard_of(self, message_id: str) -> int:
        """The shard a message takes: a stable hash of its id (CRC-32), modulo :attr:`shards`.

        Stable across processes and runs (unlike ``hash()``), so every retry of a
        task, and every lap of a long delay, takes the same shard.
        """
        if self.shards == 1:
            return 0
        return zlib.crc32(message_id.encode("utf-8")) % self.shards

    def route(self, units: int, token: str, shard: int = 0) -> tuple[str, str, int]:
        """``(entry exchange, routing key, hops)`` from one digit expansion (the publish hot path)."""
        digits = self.digits(units)
        return self._entry_of(digits, shard), self._key_of(digits, token), self._hops_of(digits)

    def hops(self, units: int) -> int:
        """Queues a message of ``units`` waits in, the exit queue included."""
        return self._hops_of(self.digits(units))

    def path(self, units: int, shard: int = 0) -> list[str]:
        """Names of the ladder queues the message waits in, in order (exit queue excluded)."""
        digits = self.digits(units)
        return [
            self.level_queue(k, digits[self.levels - 1 - k], shard)
            for k in range(self.levels - 1, -1, -1)
            if digits[self.levels - 1 - k]
        ]

    def entry_exchange(self, units: int, shard: int = 0) -> str:
        """Exchange to publish into: the entry of the most significant non-zero digit's queue.

        Publishing there, rather than at the top, skips the pass-through hops
        of the leading zeros; the routing key still carries every digit. With
        :attr:`entries` ``"fanout"`` it is that queue's own fanout exchange, else its level's.
        """
        return self._entry_of(self.digits(units), shard)

    # -- digits -> names (shared by the public methods and route()) --------
    def _key_of(self, digits: tuple[int, ...], token: str) -> str:
        return ".".join([_DIGIT_WORDS[d] for d in digits]) + "." + token

    def _hops_of(self, digits: tuple[int, ...]) -> int:
        return self.levels - digits.count(0) + 1

    def _entry_of(self, digits: tuple[int, ...], shard: int = 0) -> str:
        for i, d in enumerate(digits):
            if d:
                if self.entries == "fanout":
                    return self._entry_exchanges[shard][self.levels - 1 - i][d]
                return self._level_exchanges[shard][self.levels - 1 - i]
        return self.delivery_exchange

    @functools.cached_property
    def _level_exchanges(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(self.level_exchange(k, shard) for k in range(self.levels)) for shard in range(self.shards))

    @functools.cached_property
    def _entry_exchanges(self) -> tuple[tuple[tuple[str, ...], ...], ...]:
        """``[shard][k][digit]`` -> the entry exchange of queue ``(k, digit)`` (digit 0: unused, empty)."""
        return tuple(tuple(("",) + tuple(self.entry_exchange_of(k, d, shard) for d in range(1, self.radix))
                           for k in range(self.levels)) for shard in range(self.shards))

    # -- names -------------------------------------------------------------
    @property
    def namespace(self) -> str:
        """Prefix plus the ladder's shape, e.g. ``delayq.14x4``.

        The shape is in every level name because a ladder re-declared with other ``levels`` or ``radix`` under
        the same names would add a second set of bindings to the same exchanges and silently duplicate or
        misroute messages. A reshaped ladder is a new, disjoint one; the old one drains. (A changed unit keeps
        the names and fails loudly: queue TTLs differ.)
        """
        return f"{self.prefix}.{self.levels}x{self.radix}"

    def _levels_namespace(self, shard: int) -> str:
        """Where shard ``shard``'s levels are named: shard 0 has the unsharded names."""
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} is outside 0..{self.shards - 1}")
        return self.namespace if shard == 0 else f"{self.namespace}.s{shard}"

    def level_exchange(self, k: int, shard: int = 0) -> str:
        """Topic exchange of level ``k`` (of shard ``shard``)."""
        return f"{self._levels_namespace(shard)}.L{k:02d}"

    def level_exchanges(self) -> list[str]:
        """Every level exchange of every shard."""
        return [name for per_shard in self._level_exchanges for name in per_shard]

    def level_queue(self, k: int, digit: int, shard: int = 0) -> str:
        """Queue of level ``k`` for digit ``digit`` (TTL ``digit * radix**k`` units), of shard ``shard``."""
        if self.radix == 2:
            return f"{self._levels_namespace(shard)}.L{k:02d}"
        return f"{self._levels_namespace(shard)}.L{k:02d}.d{_DIGIT_WORDS[digit]}"

    def entry_exchange_of(self, k: int, digit: int, shard: int = 0) -> str:
        """Fanout exchange bound to queue ``(k, digit)`` alone: where a publish whose first digit that is enters.

        A fanout exchange routes without reading the key and the message keeps it, so the later hops are routed
        by the level exchanges exactly as if it had entered through :meth:`level_exchange`; only the publish's
        own match of the key is saved (the broker confirms sooner: docs/benchmarks.md, "The entry exchange").
        """
        return f"{self.level_queue(k, digit, shard)}.entry"

    def entry_exchanges(self) -> list[str]:
        """Every queue's entry exchange, in :meth:`level_queues` order."""
        return [self.entry_exchange_of(q.level, q.digit, q.shard) for q in self.level_queues()]

    def queue_ttl_ms(self, k: int, digit: int) -> int:
        """``x-message-ttl`` of queue ``(k, digit)``."""
        return digit * int(self.radix**k) * self.unit_ms

    def dead_letter_target(self, k: int, shard: int = 0) -> str:
        """Exchange that level ``k``'s queues (of shard ``shard``) dead-letter into."""
        return self.level_exchange(k - 1, shard) if k > 0 else self.delivery_exchange

    @property
    def delivery_exchange(self) -> str:
        """Topic exchange that routes a due message to its destination's exit queue."""
        return f"{self.namespace}.deliver"

    @property
    def unroutable_exchange(self) -> str:
        """Alternate exchange of the delivery exchange: catches messages with no exit queue."""
        return f"{self.prefix}.unroutable"

    @property
    def unroutable_queue(self) -> str:
        """Queue that keeps messages the delivery exchange could not route."""
        return f"{self.prefix}.unroutable"

    @property
    def laps_queue(self) -> str:
        """Queue where a delay longer than the ladder waits between laps (a worker puts it back)."""
        return f"{self.prefix}.laps"

    def exit_queue(self, label: str, token: str) -> str:
        """Exit queue of a destination: readable label (truncated) plus the token."""
        readable = _READABLE.sub("_", label)[:80]
        return f"{self.prefix}.exit.{readable}.{token}"

    def exit_binding_key(self, token: str) -> str:
        """Delivery-exchange binding key that selects the exit queue of ``token``."""
        return "*." * self.levels + token

    # -- topology -----------------------------------------------------------
    def level_queues(self) -> Iterator[LevelQueue]:
        """Every waiting queue of the ladder, shard by shard, top level first."""
        for shard in range(self.shards):
            for k in range(self.levels - 1, -1, -1):
                for d in range(1, self.radix):
                    yield LevelQueue(k, d, self.level_queue(k, d, shard), shard)

    def bindings(self) -> list[Binding]:
        """Every binding of the ladder: ``2 * radix - 1`` per level and shard, so linear in ``levels``.

        Per level: a queue per non-zero digit and the pass-through of digit 0 on the level exchange, then each
        queue's entry exchange to it (key ``""``: a fanout exchange ignores it).
        """
        out: list[Binding] = []
        for shard in range(self.shards):
            for k in range(self.levels - 1, -1, -1):
                skip = "*." * (self.levels - 1 - k)
                for d in range(1, self.radix):
                    out.append(Binding(self.level_exchange(k, shard), self.level_queue(k, d, shard), "queue",
                                       f"{skip}{_DIGIT_WORDS[d]}.#"))
                out.append(Binding(self.level_exchange(k, shard), self.dead_letter_target(k, shard), "exchange",
                                   f"{skip}0.#"))
                for d in range(1, self.radix):
                    out.append(Binding(self.entry_exchange_of(k, d, shard), self.level_queue(k, d, shard), "queue", ""))
        return out


_DIGIT_WORDS = "0123456789abcdefghijklmnopqrstuvwxyz"
