"""Names, arguments and bindings of the streams that let operators see and cancel delayed work (pure).

Two kinds of RabbitMQ stream live beside each ladder (``<namespace>`` is the
ladder's ``prefix.LEVELSxRADIX``):

* **The index of waiting tasks**: ``<namespace>.index.00`` .. ``.0f``, fed by
  the broker itself. Every ladder publish carries a ``BCC`` header naming
  one index routing key; RabbitMQ routes a copy of the message along it and
  strips the header before storing, so nothing downstream sees it. The copy
  travels ``L{k}`` (entry exchange) -> ``<namespace>.index`` (topic
  exchange) -> one index stream.
* **The cancel log**: ``<namespace>.cancels``, which workers read at start
  and follow (:mod:`celery_delayq.cancels`).

Why the BCC key names the *entry level* (measured on RabbitMQ 3.10.8 and
4.3.6): dead-lettering re-routes a message with every routing key it was
published with, BCC keys included, although the header itself is gone. With
one index key bound to every level, each hop copied the message into the
index again (a 3-hop message left 3 copies). Each level ``k`` therefore
binds only ``ix{k}.*``; a message dead-lettered into level ``k-1`` still
carries ``ix{k}.sNN``, which no binding of level ``k-1`` matches, so every
pass through the ladder leaves exactly one index entry. The index words are
at least three characters long, so they never match a ladder binding
(whose words are single digits) and never reach the delivery exchange.

Why 16 shards: an AMQP 0-9-1 client reads a stream at the rate the broker
converts stored messages back into deliveries, about 6,000-18,000 per
second on this 2-core machine (3.10.8 / 4.3.6, under load). A lookup by task
id reads only the shard of that id (the shard is a hash of the id), so with
1,000,000 waiting tasks it reads about 62,500 entries rather than a million.

Retention: both streams keep ``x-max-age`` = the ladder's maximum delay plus
:data:`MARGIN_S`, so every task that can still be waiting has its entry, and
the streams do not grow for ever (RabbitMQ drops whole segments once they
are older than that; small segments make that happen in small steps).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

from ..ladder import Binding, LadderSpec

__all__ = ["IndexLayout", "MARGIN_S", "SHARDS", "STREAM_VERSION", "MARKER", "index_layout"]

#: Index shards (streams) per ladder; see the module docstring.
SHARDS = 16
#: Kept beyond the ladder's maximum delay: lateness (a broker outage, a burst
#: draining) must not let a cancel expire before its task arrives.
MARGIN_S = 86400
#: Streams exist from RabbitMQ 3.9.
STREAM_VERSION = (3, 9)
#: Header of a marker message: a reader writes one and reads up to it, because
#: AMQP 0-9-1 does not say where a stream ends.
MARKER = "x-delayq-marker"

_INDEX_SEGMENT_BYTES = 64_000_000
_CANCEL_SEGMENT_BYTES = 4_000_000


@dataclass(frozen=True)
class IndexLayout:
    """The index and cancel-log streams of one ladder.

    Attributes:
        spec: The ladder.
        index: Whether the index of waiting tasks exists (``delayq_index``);
            the cancel log always does.
        shards: Number of index streams.
    """

    spec: LadderSpec
    index: bool = True
    shards: int = SHARDS

    # -- names ---------------------------------------------------------------
    @property
    def exchange(self) -> str:
        """Topic exchange between the level exchanges and the index streams."""
        return f"{self.spec.namespace}.index"

    def shard_queue(self, shard: int) -> str:
        """Name of index stream ``shard``."""
        return f"{self.spec.namespace}.index.{shard:02x}"

    @property
    def shard_queues(self) -> list[str]:
        """Every index stream (empty when the index is off)."""
        return [self.shard_queue(h) for h in range(self.shards)] if self.index else []

    @property
    def cancel_queue(self) -> str:
        """The cancel log stream."""
        return f"{self.spec.namespace}.cancels"

    @property
    def streams(self) -> list[str]:
        """Every stream of the layout."""
        return [*self.shard_queues, self.cancel_queue]

    @property
    def max_age_s(self) -> int:
        """Retention of every stream: the ladder's maximum delay plus :data:`MARGIN_S`."""
        return int(self.spec.max_delay_s) + 1 + MARGIN_S

    # -- routing ---------------------------------------------------------------
    def shard_of(self, task_id: str) -> int:
        """The index shard of a task id (stable across processes and versions)."""
        return hashlib.blake2b(task_id.encode("utf-8"), digest_size=2).digest()[0] % self.shards

    def bcc(self, entry_exchange: str, task_id: str) -> list[str] | None:
        """The ``BCC`` header value for a publish into ``entry_exchange``, or None (no index)."""
        if not self.index:
            return None
        level = self._levels.get(entry_exchange)
        if level is None:  # the delivery exchange: due already, nothing to index
            return None
        return [f"ix{level:02d}.s{self.shard_of(task_id):02x}"]

    @functools.cached_property
    def _levels(self) -> dict[str, int]:
        return {self.spec.level_exchange(k): k for k in range(self.spec.levels)}

    # -- topology ----------------------------------------------------------------
    def entities(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(kind, name, args)`` like :meth:`~celery_delayq.topology.Topology.entities`, targets first."""
        plan: list[tuple[str, str, dict[str, Any]]] = []
        if self.index:
            plan.append(("exchange:topic", self.exchange, {}))
            plan += [("queue", name, self.stream_args(_INDEX_SEGMENT_BYTES)) for name in self.shard_queues]
        plan.append(("queue", self.cancel_queue, self.stream_args(_CANCEL_SEGMENT_BYTES)))
        return plan

    def stream_args(self, segment_bytes: int) -> dict[str, Any]:
        """Declare arguments of one stream."""
        return {"x-queue-type": "stream", "x-max-age": f"{self.max_age_s}s",
                "x-stream-max-segment-size-bytes": segment_bytes}

    def bindings(self) -> list[Binding]:
        """Level exchanges -> index exchange (one key per level), index exchange -> each shard."""
        if not self.index:
            return []
        out = [Binding(self.spec.level_exchange(k), self.exchange, "exchange", f"ix{k:02d}.*")
               for k in range(self.spec.levels)]
        out += [Binding(self.exchange, self.shard_queue(h), "queue", f"*.s{h:02x}") for h in range(self.shards)]
        return out


def index_layout(spec: LadderSpec, *, index: bool, version: tuple[int, ...]) -> IndexLayout | None:
    """The layout for a ladder on a broker of ``version``; None where streams do not exist (< 3.9)."""
    if version < STREAM_VERSION:
        return None
    return IndexLayout(spec, index=index)
