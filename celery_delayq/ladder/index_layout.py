"""Names and arguments of the streams that let operators see and cancel delayed work (pure).

Two kinds of RabbitMQ stream live beside each ladder (``<namespace>`` is the ladder's ``prefix.LEVELSxRADIX``):

* **The index of waiting tasks**: ``<namespace>.index.00`` .. ``.0f``. The ladder publisher appends a compact
  entry for every message the broker accepted into the ladder (:mod:`.writer`); a task id always goes to the
  same shard.
* **The cancel log**: ``<namespace>.cancels``, which workers read at start and follow (:mod:`celery_delayq.cancels`).

Why 16 shards: docs/footprint.md; why the broker does not write the index itself (a ``BCC`` copy): :mod:`.writer`.

Retention: every stream keeps ``x-max-age`` = the ladder's maximum delay plus :data:`MARGIN_S`, so every task
that can still be waiting has its entry and the streams do not grow for ever (small segments: small steps).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - only named: a caller passes the spec
    from .spec import LadderSpec

__all__ = ["IndexLayout", "MARGIN_S", "SHARDS", "STREAM_VERSION", "MARKER", "ENTRIES", "index_layout"]

#: Index shards (streams) per ladder; why 16: docs/footprint.md.
SHARDS = 16
#: Kept beyond the ladder's maximum delay: lateness (a broker outage, a burst
#: draining) must not let a cancel expire before its task arrives.
MARGIN_S = 86400
#: Streams exist from RabbitMQ 3.9.
STREAM_VERSION = (3, 9)
#: Header of a marker message: a reader writes one and reads up to it, because
#: AMQP 0-9-1 does not say where a stream ends.
MARKER = "x-delayq-marker"
#: Header of an index message: how many entries its body holds (the writer writes it, a reader looks for it).
ENTRIES = "x-delayq-index-entries"

_INDEX_SEGMENT_BYTES = 64_000_000
_CANCEL_SEGMENT_BYTES = 4_000_000


@dataclass(frozen=True)
class IndexLayout:
    """The index and cancel-log streams of one ladder.

    Attributes:
        spec: The ladder.
        index: Whether the index of waiting tasks exists (``delayq_index``); the cancel log always does.
        shards: Number of index streams.
        previous: Layouts of earlier shapes still read (see the attribute).
    """

    spec: LadderSpec
    index: bool = True
    shards: int = SHARDS
    #: The layouts of shapes the app used before (``delayq_previous_shapes``): readers read them too,
    #: oldest first, until their ladders drain and are deleted; writers write only to this one.
    previous: tuple[IndexLayout, ...] = ()

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

    def shard_of(self, task_id: str) -> int:
        """The index shard of a task id (stable across processes and versions)."""
        return hashlib.blake2b(task_id.encode("utf-8"), digest_size=2).digest()[0] % self.shards

    def entities(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(kind, name, args)`` like :meth:`~celery_delayq.rabbitmq.topology.Topology.entities`."""
        plan: list[tuple[str, str, dict[str, Any]]] = [
            ("queue", name, self.stream_args(_INDEX_SEGMENT_BYTES)) for name in self.shard_queues]
        plan.append(("queue", self.cancel_queue, self.stream_args(_CANCEL_SEGMENT_BYTES)))
        return plan

    def stream_args(self, segment_bytes: int) -> dict[str, Any]:
        """Declare arguments of one stream."""
        return {"x-queue-type": "stream", "x-max-age": f"{self.max_age_s}s",
                "x-stream-max-segment-size-bytes": segment_bytes}


def index_layout(spec: LadderSpec, *, index: bool, version: tuple[int, ...]) -> IndexLayout | None:
    """The layout for a ladder on a broker of ``version``; None where streams do not exist (< 3.9)."""
    if version < STREAM_VERSION:
        return None
    return IndexLayout(spec, index=index)
