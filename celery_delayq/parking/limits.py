"""Delivery limits: why a look at a parking queue can cost a parked message, and how it cannot (docs/retries.md).

A look hands each message back, which a quorum queue may count towards its ``delivery-limit`` (each broker
line differently): a queue declared with one earlier is refused before a look, naming
:func:`~celery_delayq.parking.queue.ParkingQueue.redeclare`.
"""

from __future__ import annotations

import re

from ..rabbitmq.client import AccessRefused, Connection, PreconditionFailed, throwaway_channel
from ..rabbitmq.delivery_limit import DEFAULT_LIMIT_FROM, NACK_UNCOUNTED_FROM, declare_arguments
from .errors import UnsafeToBrowse

__all__ = ["browse_risk", "check_browsable"]

_INEQUIVALENT = re.compile(r"inequivalent arg '([^']+)'")


def browse_risk(connection: Connection, queue: str, version: tuple[int, ...]) -> str | None:
    """Why handing a message of the existing ``queue`` back could count towards a drop; ``None`` if it cannot.

    Before 4.3 the queue is declared again (scratch channel) with a parking queue's quorum
    arguments; the first argument the broker says differs tells (unknown: a risk on 4.0-4.2).
    """
    if version >= NACK_UNCOUNTED_FROM:
        return None
    expected = declare_arguments("quorum", version)
    with throwaway_channel(connection) as ch:
        try:
            ch.queue_declare(queue, durable=True, auto_delete=False, arguments=expected)
            return None
        except PreconditionFailed as exc:
            found = _INEQUIVALENT.search(str(exc))
            arg = found.group(1) if found else None
        except AccessRefused:
            arg = "permission"  # a read-only user cannot declare: the limit is unknown
    shown = ".".join(map(str, version))
    if arg == "x-queue-type":
        return None
    if arg == "x-delivery-limit":
        if version >= DEFAULT_LIMIT_FROM:
            return (f"it is a quorum queue with a delivery limit (declared without x-delivery-limit = -1, "
                    f"RabbitMQ {shown} gives it 20)")
        return f"it is a quorum queue declared with an x-delivery-limit (RabbitMQ {shown} counts every look)"
    if version >= DEFAULT_LIMIT_FROM:
        why = "you may not declare it" if arg == "permission" else f"its argument {arg!r} differs from a parking queue's"
        return (f"it may be a quorum queue with RabbitMQ {shown}'s default delivery limit of 20, "
                f"and this cannot be checked ({why})")
    return None


def check_browsable(connection: Connection, queue: str, version: tuple[int, ...]) -> None:
    """Raise :class:`UnsafeToBrowse` when a look at ``queue`` could make the broker drop a parked message."""
    risk = browse_risk(connection, queue, version)
    if risk is None:
        return
    raise UnsafeToBrowse(
        f"refusing to read parking queue {queue!r}: {risk}. Each look hands its messages back, that counts "
        "as a delivery, and at the limit the broker drops the message. Nothing was read. Fix it once, either: "
        f"ParkingQueue.for_app(app, {queue!r}).redeclare() (recreates it without a delivery limit and keeps "
        "every message, in order), or upgrade RabbitMQ to 4.3+, where a look does not count. "
        "Purging the whole queue (no filter) is safe now.")
