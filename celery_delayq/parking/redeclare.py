"""Recreate a parking queue with today's arguments (a queue's cannot change), keeping every message, in order.

Messages move to ``<queue>.redeclare`` and back in transactions (each always in one of the two
queues; rerun to finish an interrupted run). Quorum queues refuse ``queue.delete(if_empty)``, so
a message parked between the emptiness check and the delete is lost and reported: run it when
no worker is parking.
"""

from __future__ import annotations


from ..rabbitmq.client import Connection, Message, broker_version, declare_queue, throwaway_channel
from .errors import ParkingError
from ..rabbitmq.delivery_limit import declare_arguments
from .record import LOOK_HEADERS
from ..rabbitmq.probe import queue_depth
from .scan import Scan

__all__ = ["redeclare", "SUFFIX"]

#: Suffix of the queue that holds the messages while their queue is recreated.
SUFFIX = ".redeclare"
_ROUNDS = 20


def _copy(message: Message) -> Message:
    props = dict(message.properties)
    props["application_headers"] = {k: v for k, v in (message.headers or {}).items() if k not in LOOK_HEADERS}
    return Message(message.body, **props)


def _move(connection: Connection, source: str, target: str, batch_size: int) -> int:
    moved = 0
    with Scan(connection, source, transactional=True, check_limit=False) as scan:
        for message, _parked in scan:
            scan.channel.basic_publish(_copy(message), "", target)
            scan.ack(message)
            moved += 1
            if moved % batch_size == 0:
                scan.commit()
        scan.commit()
    return moved


def _drain_and_delete(connection: Connection, source: str, target: str, batch_size: int) -> int:
    """Move everything from ``source`` to ``target``, then delete ``source`` once empty; returns messages moved."""
    moved = 0
    for _ in range(_ROUNDS):
        moved += _move(connection, source, target, batch_size)
        if queue_depth(connection, source):
            continue  # something was parked meanwhile: move it too
        with throwaway_channel(connection) as ch:
            dropped = ch.queue_delete(source) or 0
        if dropped:
            raise ParkingError(f"{dropped} message(s) parked into {source!r} in the instant before it was "
                               "deleted were lost; every other message is kept. Run redeclare when no "
                               "worker is parking (the moved messages are safe in either queue).")
        return moved
    raise ParkingError(f"{source!r} kept filling up while its messages were moved to {target!r}; every "
                       "message is in one of the two queues. Run redeclare again when parking is quieter.")


def redeclare(connection: Connection, queue: str, *, queue_type: str = "quorum",
              batch_size: int = 500) -> int:
    """Recreate ``queue`` as a parking queue of ``queue_type`` without a delivery limit; returns messages kept."""
    version = broker_version(connection)
    args = declare_arguments(queue_type, version)
    hold = queue + SUFFIX
    declare_queue(connection, hold, args)
    if queue_depth(connection, queue) is not None:
        _drain_and_delete(connection, queue, hold, batch_size)
    declare_queue(connection, queue, args)
    _drain_and_delete(connection, hold, queue, batch_size)
    return queue_depth(connection, queue) or 0
