"""``delayq_backend = "buckets"``: one queue per destination and due second, one hop, the ladder beyond it.

Work that comes due together (a burst toward one moment, a million due within a minute) waits in the queue of
its *due time*, not of its delay: each message is published with a per-message TTL that ends exactly at the end
of its due slice, so everything in a queue expires at the same moment (nothing waits behind a longer delay,
whatever order the messages came in) and then dead-letters straight into its destination, as a ``fixed`` queue
does. A queue deletes itself (``x-expires``) a lease after it was created, a lease that always ends
``delayq_bucket_grace`` after its due slice; how many one process keeps alive is bounded
(``delayq_bucket_queues``) and each new one must fit RabbitMQ 3.x's file-handle budget. Whatever does not fit
goes through the ladder: a delay beyond ``delayq_bucket_max_delay`` silently, as every long delay; one over the
bound or refused by the broker logged once per reason and destination.

It is the default backend, with two guards that keep the ladder (and its 10 ms precision) where a bucket would
not pay: a delay under ``delayq_bucket_min_delay`` (30 s), and the first ``delayq_bucket_after`` (100) tasks of
one process toward a destination's due second.

A delay that an app *repeats* (a fixed ``countdown``, a retry's backoff step) takes a queue of its own: once
one process has sent the same delay (to the ladder's unit, up to ``delayq_bucket_max_delay``) toward a
destination more than ``delayq_recurring_after`` times in a ten-minute window, the rest of that window's go to
a queue of that delay and window, every message with that same TTL (so they expire in the order they came:
nothing waits behind a longer one), one hop. A long delay is checked for this before its due second's bucket:
steady traffic with one countdown takes one queue per window and shard, where buckets would open a set of
queues every second (measured: docs/how-it-works.md, "Steady traffic"). Named by its window because a quorum
queue's ``x-expires`` counts from its creation: a redeclare does not renew it (measured on 3.10.8 and 4.3.6).
The design and its measurements: docs/how-it-works.md, "The default" and "The `buckets` backend".
"""

from __future__ import annotations

import collections
import itertools
import math
from typing import Any, NamedTuple

import amqp

from ..errors import DelayqError
from ..ladder.spec import LadderSpec
from .budget import RESERVATIONS_GONE_FROM
from .client import broker_version
from .fixed import FixedDelays, fixed_ttl_ms
from .publisher import LadderPublisher, Route, plan
from .topology import Destination, Topology

__all__ = ["DueBuckets", "Bucket", "bucket_for", "recurring_for", "bucket_queue_name", "bucket_queue_prefix",
           "LEASE_STEP_S", "RECURRING_WINDOW_S", "RECURRING_DELAYS", "ALIVE_3X", "ALIVE_4X", "SHARDS_3X", "SHARDS_4X"]

#: Leases are whole multiples of this (plus the grace), so the publishes of five minutes toward a due slice share
#: one queue, and a drained queue lingers at most this much longer than the grace.
LEASE_STEP_S = 300
#: A recurring delay's queue takes the publishes of one window this long (epoch-aligned), and is counted per window.
RECURRING_WINDOW_S = 600
#: Distinct recurring delays one process gives queues to per window: an app's few repeated delays, not every
#: value of a spread that happens to repeat at a high rate (those keep the ladder, logged once).
RECURRING_DELAYS = 4
#: ``delayq_bucket_queues`` when unset: RabbitMQ 3.x (file handles per quorum queue) and 4.x.
ALIVE_3X, ALIVE_4X = 64, 512
#: ``delayq_bucket_shards`` when unset: queues per due second on RabbitMQ 3.x and 4.x.
SHARDS_3X, SHARDS_4X = 4, 8
#: Due slices whose counts (``delayq_bucket_after``) one process keeps before it forgets those already past.
_COUNTED = 4096
#: Distinct long delays (``delayq_bucket_min_delay`` and over) one process counts toward recurring at once, the
#: least recently sent forgotten first: a repeated countdown keeps its count, the spread of delays of a burst
#: toward one moment (a new value every unit) never reaches ``delayq_recurring_after`` and keeps its buckets.
_LONG_COUNTED = 64


class Bucket(NamedTuple):
    """The due-time bucket of one message (pure: :func:`bucket_for`)."""

    #: The end of the due slice, epoch milliseconds: every message in the queue expires then.
    slice_end_ms: int
    #: The message's TTL: from now to the end of its slice, rounded up (never early).
    expiration_ms: int
    #: The queue's ``x-expires`` (and ``x-message-ttl``, an upper bound): at least until the slice end plus the
    #: grace from any moment the queue may be declared with this name.
    lease_ms: int


def bucket_for(due: float, now: float, *, width_s: float, max_delay_s: float, grace_s: float) -> Bucket | None:
    """Pure: the bucket for a message due at ``due`` (epoch seconds) published at ``now``; ``None`` (the ladder)
    when the delay is not positive or the slice's end lies beyond ``max_delay_s``.

    The slice end is ``due`` rounded *up* to a multiple of ``width_s`` since the epoch, so publishers anywhere
    agree on it (clocks permitting) and a message is never early; it may be up to ``width_s`` late.
    """
    if not due > now or not math.isfinite(due) or not math.isfinite(now):
        return None
    step_us = round(width_s * 1_000_000)
    due_us = round(due * 1_000_000)  # microseconds first, so float noise does not cost a whole slice
    end_us = -(-due_us // step_us) * step_us
    now_us = round(now * 1_000_000)
    if end_us - now_us > max_delay_s * 1_000_000:
        return None
    expiration_ms = -(-(end_us - now_us) // 1000)
    lease_step_us = LEASE_STEP_S * 1_000_000
    lease_us = -(-(end_us - now_us) // lease_step_us) * lease_step_us + round(grace_s * 1_000_000)
    return Bucket(-(-end_us // 1000), expiration_ms, -(-lease_us // 1000))


def recurring_for(remaining_s: float, now: float, *, unit_ms: int, window_s: float, under_s: float,
                  grace_s: float) -> Bucket | None:
    """Pure: the queue of a delay an app repeats, published at ``now``: every message in it waits
    ``expiration_ms`` (``remaining_s`` rounded *up* to ``unit_ms``, as the ladder rounds: never early), and
    ``slice_end_ms`` is the end of the epoch-aligned window of ``window_s`` it takes the publishes of. ``None``
    (the ladder, or a bucket) when the delay is not positive or, rounded, not under ``under_s``: the bound of its
    family, ``delayq_bucket_min_delay`` for short delays, ``delayq_bucket_max_delay`` for long ones.

    The lease counts from the queue's creation, at the window's start at the earliest, and outlives the last
    message's expiry (window end + a delay under ``under_s``) by ``grace_s``, so it is the same for every
    declarer (and, as the bound is in it, in the queue's name: the two families never share a queue).
    """
    if not 0 < remaining_s < under_s or not math.isfinite(now):
        return None
    expiration_ms = fixed_ttl_ms(remaining_s, resolution_s=unit_ms / 1000, max_delay_s=under_s)
    if expiration_ms is None:  # rounded up to the unit, beyond the bound
        return None
    window_us = round(window_s * 1_000_000)
    end_us = (round(now * 1_000_000) // window_us + 1) * window_us
    lease_s = math.ceil(window_s) + math.ceil(under_s) + math.ceil(grace_s)
    return Bucket(-(-end_us // 1000), expiration_ms, lease_s * 1000)


def bucket_queue_prefix(prefix: str) -> str:
    """What every bucket queue of ladder prefix ``prefix`` is named with first."""
    return f"{prefix}.bucket."


def bucket_queue_name(spec: LadderSpec, dest: Destination, bucket: Bucket, shard: int = 0, *,
                      recurring: bool = False) -> str:
    """``<prefix>.bucket.<slice end ms>.<lease s>s.<shard>.<destination label>.<token>``; a recurring delay's
    has its delay before the label (``....<shard>.<expiration>ms.<label>.<token>``)."""
    label = dest.exit_queue[len(f"{spec.prefix}.exit."):]
    delay = f"{bucket.expiration_ms}ms." if recurring else ""
    return (f"{bucket_queue_prefix(spec.prefix)}{bucket.slice_end_ms}.{bucket.lease_ms // 1000}s.{shard}."
            f"{delay}{label}")


class DueBuckets(FixedDelays):
    """The ``buckets`` backend: a :class:`~celery_delayq.typing.DelayBackend` over the ladder publisher (its
    publishing, confirms, batches and worker service are the ``fixed`` backend's)."""

    KIND = "a due-time bucket"

    def __init__(self, ladder: LadderPublisher) -> None:
        super().__init__(ladder)
        #: queue name -> when this process's declare of it lapses (epoch s): the buckets it keeps alive.
        self.alive: dict[str, float] = {}
        #: ``(exchange, routing key, slice or window end ms, recurring delay ms or 0)`` -> messages this process
        #: sent toward it.
        self.counts: dict[tuple[str, str, int, int], int] = {}
        #: ``(exchange, routing key, slice end ms, recurring delay ms or 0)`` -> the lease its open queues have.
        self.leases: dict[tuple[str, str, int, int], int] = {}
        #: The window (end ms) and the ``(exchange, routing key, delay ms)`` given recurring queues in it.
        self.recurring: tuple[int, set[tuple[str, str, int]]] = (0, set())
        #: ``(exchange, routing key, window end ms, delay ms)`` -> sends of a long delay (the recent ones only).
        self.long_counts: collections.OrderedDict[tuple[str, str, int, int], int] = collections.OrderedDict()
        self._turn = itertools.count()
        self._pruned_at = 0.0
        self._four: bool | None = None

    def __repr__(self) -> str:
        return f"<DueBuckets {len(self.alive)} queue(s) over {self.ladder!r}>"

    def _route(self, dest: Destination, due: float, now: float, shard: int) -> Route | tuple[int, str, str, int]:
        """The bucket queue by the default exchange, with its per-message TTL, or the ladder's route."""
        config = self.config
        remaining = due - now
        if remaining < config.bucket_min_delay:  # most delays: the ladder's precision, unless the app repeats it
            if config.recurring_after:
                found = self._recurring(dest, remaining, now)
                if found is not None:
                    return found
            return plan(self.ladder.spec, dest, due=due, now=now, shard=shard)
        # Beyond delayq_bucket_max_delay (as every long delay): the ladder's, not logged, and nothing counted (a
        # microsecond over, so that no slice end bucket_for would still take is sent past it).
        if remaining > config.bucket_max_delay + 1e-6:
            return plan(self.ladder.spec, dest, due=due, now=now, shard=shard)
        if config.recurring_after:  # one countdown, steady: a queue per window, not a set per second
            found = self._recurring(dest, remaining, now, long=True)
            if found is not None:
                return found
        bucket = bucket_for(due, now, width_s=config.bucket_width, max_delay_s=config.bucket_max_delay,
                            grace_s=config.bucket_grace)
        # Alone so far in its second: the ladder's precision, and no queue of its own.
        if bucket is not None and self._together((dest.exchange, dest.routing_key, bucket.slice_end_ms, 0), now,
                                                 config.bucket_after):
            name = self._bucket(dest, bucket, next(self._turn) % self._shards(), now)  # round robin over shards
            if name is not None:
                return Route(self.ladder.spec.units_for(bucket.expiration_ms / 1000), "", name, 1,
                             bucket.expiration_ms)
        return plan(self.ladder.spec, dest, due=due, now=now, shard=shard)

    def _recurring(self, dest: Destination, remaining: float, now: float, *, long: bool = False) -> Route | None:
        """The queue of a delay this process repeats toward ``dest`` (``None``: not often enough yet in this
        window, or no queue could be had: the ladder, or for a ``long`` one, under ``delayq_bucket_max_delay``
        and not under ``delayq_bucket_min_delay``, its bucket)."""
        spec, config = self.ladder.spec, self.config
        found = recurring_for(remaining, now, unit_ms=spec.unit_ms, window_s=RECURRING_WINDOW_S,
                              under_s=config.bucket_max_delay if long else config.bucket_min_delay,
                              grace_s=config.bucket_grace)
        if found is None:
            return None
        key4 = (dest.exchange, dest.routing_key, found.slice_end_ms, found.expiration_ms)
        if not (self._long_together(key4) if long else self._together(key4, now, config.recurring_after)):
            return None
        key = (dest.exchange, dest.routing_key, found.expiration_ms)
        with self._lock:
            if self.recurring[0] != found.slice_end_ms:  # a new window: its delays are counted afresh
                self.recurring = (found.slice_end_ms, set())
            keys = self.recurring[1]
            if key not in keys:
                if len(keys) >= RECURRING_DELAYS:
                    if not long:  # a long one keeps its bucket, as before it recurred
                        self._tell(f"more than {RECURRING_DELAYS} recurring delays in ten minutes", dest)
                    return None
                keys.add(key)
        name = self._bucket(dest, found, next(self._turn) % self._shards(), now, recurring=True)
        if name is None:
            return None
        return Route(found.expiration_ms // spec.unit_ms, "", name, 1, found.expiration_ms)

    def _together(self, key: tuple[str, str, int, int], now: float, after: int) -> bool:
        """Count a message toward its slice (or a recurring delay's window): ``True`` once more than ``after``
        did (always, when ``after`` is 0)."""
        if not after:
            return True
        with self._lock:
            seen = self.counts[key] = self.counts.get(key, 0) + 1
            if len(self.counts) > _COUNTED and now - self._pruned_at >= 1.0:  # a scan at most once a second
                self._pruned_at = now
                for past in [k for k in self.counts if k[2] <= now * 1000]:
                    del self.counts[past]
                if len(self.counts) > 4 * _COUNTED:  # that many future slices: start counting afresh
                    self.counts.clear()
        return seen > after

    def _long_together(self, key: tuple[str, str, int, int]) -> bool:
        """Count a send of a long delay: ``True`` once it came more than ``delayq_recurring_after`` times while
        among the :data:`_LONG_COUNTED` most recently sent delays."""
        with self._lock:
            counts = self.long_counts
            seen = counts[key] = counts.pop(key, 0) + 1  # the most recent last
            if len(counts) > _LONG_COUNTED:
                counts.popitem(last=False)
        return seen > self.config.recurring_after

    def _on_4x(self) -> bool:
        """Whether the broker is RabbitMQ 4.x or later (no file handles reserved per quorum queue)."""
        if self._four is None:
            self._four = broker_version(self.ladder.link.raw) >= RESERVATIONS_GONE_FROM
        return self._four

    def _limit(self) -> int:
        """``delayq_bucket_queues``, or by broker line: 3.x reserves file handles per quorum queue, 4.x none."""
        if self.config.bucket_queues is not None:
            return self.config.bucket_queues
        return ALIVE_4X if self._on_4x() else ALIVE_3X

    def _shards(self) -> int:
        """``delayq_bucket_shards``, or by broker line (measured: docs/how-it-works.md, "The `buckets` backend")."""
        if self.config.bucket_shards is not None:
            return self.config.bucket_shards
        return SHARDS_4X if self._on_4x() else SHARDS_3X

    def _bucket(self, dest: Destination, bucket: Bucket, spread: int, now: float, *,
                recurring: bool = False) -> str | None:
        """The queue of shard ``spread`` of the bucket; the first time, every shard's queue is declared.

        A slice this process opened under another lease (its publishes went on across a lease step) keeps that
        one: whoever declared a queue of that name, when, it lives until the slice end plus the grace (see
        :func:`bucket_for`), so the slice does not take a second set of queues.
        """
        key = (dest.exchange, dest.routing_key, bucket.slice_end_ms, bucket.expiration_ms if recurring else 0)
        with self._lock:
            lease = self.leases.get(key)
            if lease is not None and lease != bucket.lease_ms:
                bucket = bucket._replace(lease_ms=lease)
            name = bucket_queue_name(self.ladder.spec, dest, bucket, spread, recurring=recurring)
            if name in self.alive:  # every publish after the first of its shard: one name, no listing
                return name
            names = [bucket_queue_name(self.ladder.spec, dest, bucket, k, recurring=recurring)
                     for k in range(self._shards())]
            for gone in [n for n, lapses in self.alive.items() if lapses <= now]:
                del self.alive[gone]  # deleted by the broker by now, or by the next declare of others
            for past in [k for k in self.leases if k[2] / 1000 + self.config.bucket_grace <= now]:
                del self.leases[past]
            limit = self._limit()
            if len(self.alive) + len(names) > limit:
                self._tell(f"more than delayq_bucket_queues ({limit}) alive", dest)
                return None
            lease = bucket.lease_ms
            try:
                if not self._open(names, self.ladder_topology().bucket_queue_args(lease, dest.exchange,
                                                                                  dest.routing_key)):
                    self._tell(f"queue {names[0]!r} does not exist and delayq_declare is False", dest)
                    return None
            except (DelayqError, amqp.exceptions.AMQPError, OSError) as exc:  # the ladder holds it instead:
                # FileHandleBudgetExceeded/Unknown, a refused or mismatched declare, a connection lost in it
                self._tell(f"not declared ({exc})", dest)
                return None
            self.alive.update((each, now + lease / 1000) for each in names)
            self.leases[key] = lease
            return name

    def ladder_topology(self) -> Topology:
        """The ladder's topology (connected: ``place_on`` declared the ladder before it routes)."""
        topology = self.ladder.topology
        assert topology is not None
        return topology

    def _open(self, names: list[str], args: dict[str, Any]) -> bool:
        """Declare the shards' queues of one bucket, one file-handle check for all of them (RabbitMQ 3.x);
        ``False`` when one is missing and ``delayq_declare`` is off."""
        topology = self.ladder_topology()
        raw: amqp.Connection = self.ladder.link.raw
        if self.config.declare and topology.budget is not None and topology.queue_type == "quorum":
            topology.budget(names[0], len(names), what="due-time bucket")
        ch = raw.channel()
        try:
            for name in names:
                if self.config.declare:
                    ch.queue_declare(name, durable=True, auto_delete=False, arguments=args)
                else:
                    try:
                        ch.queue_declare(name, passive=True)
                    except amqp.NotFound:
                        return False
            return True
        finally:
            if ch.is_open:
                ch.close()
