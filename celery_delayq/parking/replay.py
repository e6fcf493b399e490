"""Replay parked messages to where they came from: never lost, never duplicated by an interruption.

Each batch publishes the copies and acks the originals in one AMQP transaction (both or neither).
Only a *broker* crash mid-commit can apply the publish without the ack; copies carry
``x-delayq-replay`` = the parked id, so ``delayq_dedup`` runs such a copy once. A copy returned
by a destination deleted meanwhile is parked again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from .. import signals
from ..rabbitmq.client import Connection, Message
from ..rabbitmq.probe import destination_exists
from ..rabbitmq.publisher import LadderPublisher
from . import record as R
from .record import ParkedFilter, ParkedMessage
from .scan import Scan

__all__ = ["ReplayReport", "replay"]

Progress = Callable[[int, int], None]


@dataclass
class ReplayReport:
    """What a replay did. Messages not counted as ``replayed`` are still parked (or parked again)."""

    replayed: int = 0
    skipped: int = 0
    unroutable: int = 0
    reparked: int = 0


def _copy(parked: ParkedMessage, headers: dict[str, Any]) -> Message:
    return Message(parked.body, application_headers=headers, **dict(parked.properties))


def replay(connection: Connection, queue: str, *, match: ParkedFilter | None = None,
           delay: float | None = None, limit: int | None = None, reset_attempts: bool = False,
           batch_size: int = 100, ladder: LadderPublisher | None = None,
           progress: Progress | None = None) -> ReplayReport:
    """Replay the parked messages of ``queue`` that ``match``, in transactional batches.

    Args:
        delay: Seconds to wait before the replayed messages run, through the
            ladder (``ladder`` is then required); ``None`` or 0 = at once.
        limit: Replay at most this many messages.
        reset_attempts: Start the tasks' attempts over (see :meth:`ParkedMessage.replay_headers`).
        batch_size: Messages per transaction; a kill loses the current batch's
            progress, never a message.
        progress: Called with ``(messages looked at, messages in the queue)`` after each commit.
    """
    if delay and ladder is None:
        raise ValueError("a delayed replay needs the ladder publisher (ladder=...)")
    match = match or ParkedFilter()
    report = ReplayReport()
    # Is a destination routable? Checked once per destination, on a scratch channel.
    routable = functools.cache(lambda exchange, routing_key: bool(exchange or routing_key)
                               and destination_exists(connection, exchange, routing_key))
    returned: list[str] = []
    with Scan(connection, queue, transactional=True) as scan:
        ch = scan.channel
        ch.events["basic_return"].add(
            lambda exc, exchange, routing_key, message: returned.append(
                str((message.headers or {}).get(R.REPLAY, ""))))
        batch: dict[str, ParkedMessage] = {}
        seen = 0

        def commit() -> None:
            scan.commit()  # publishes and acks of the batch: all or nothing
            report.replayed += len(batch) - len(returned)
            for parked in (p for i, p in batch.items() if i not in returned):  # telemetry: replayed
                signals.message_replayed.send(sender=queue, parked=parked, delay=delay)
            for parked_id in returned:  # destination vanished mid-replay: park again
                back = batch.get(parked_id)
                if back is not None:
                    ch.basic_publish(_copy(back, dict(back.headers)), "", queue)
                    report.reparked += 1
            if returned:
                scan.commit()
            returned.clear()
            batch.clear()
            if progress is not None:
                progress(seen, scan.total)

        for message, parked in scan:
            seen += 1
            if not match(parked) or (limit is not None and report.replayed + len(batch) >= limit):
                report.skipped += 1
                continue  # not taken: the scan hands it back when it ends
            if not routable(parked.exchange, parked.routing_key):
                report.unroutable += 1
                continue
            headers = parked.replay_headers(reset_attempts=reset_attempts)
            if delay and delay > 0:  # a ladder pass to the parked message's destination
                assert ladder is not None
                exchange, routing_key = ladder.plan_pass(parked.exchange, parked.routing_key, headers, delay=delay)
            else:
                exchange, routing_key = parked.exchange, parked.routing_key
            ch.basic_publish(_copy(parked, headers), exchange, routing_key, mandatory=True)
            scan.ack(message)
            batch[parked.parked_id] = parked
            if len(batch) >= batch_size:
                commit()
        commit()
    return report
