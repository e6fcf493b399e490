"""How many messages wait in each ladder queue (for ``delayq status`` and the demo)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import amqp

from ..ladder.spec import LadderSpec

__all__ = ["LevelOccupancy", "ladder_occupancy"]


@dataclass(frozen=True)
class LevelOccupancy:
    """One ladder queue and the messages it holds right now."""

    queue: str
    level: int
    ttl_ms: int
    messages: int


def ladder_occupancy(connection: amqp.Connection, spec: LadderSpec, *, nonempty: bool = False) -> list[LevelOccupancy]:
    """Ready-message count of every ladder queue, top level first (passive declares, no side effects)."""
    rows: list[LevelOccupancy] = []
    ch = connection.channel()
    try:
        for k, d, name, _shard in spec.level_queues():
            try:
                count = ch.queue_declare(name, passive=True).message_count
            except amqp.NotFound:
                ch = connection.channel()
                count = -1
            if count or not nonempty:
                rows.append(LevelOccupancy(name, k, spec.queue_ttl_ms(k, d), count))
    finally:
        with contextlib.suppress(Exception):
            ch.close()
    return rows
