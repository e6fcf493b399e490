"""Delivery limits: why a look at a parking queue can cost a parked message, and how it cannot.

AMQP 0-9-1 has no non-destructive read: a browse takes each message and
hands it back. On a quorum queue a message handed back may count as a
delivery, and at the queue's ``delivery-limit`` the broker drops it (or
dead-letters it). Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6 (DESIGN-NOTES §7, §8):

* 3.10 has no default limit, and ``x-delivery-limit: -1`` there means "drop
  at the first return", so a parking queue is declared without the argument.
* 4.0 gives every quorum queue a default limit of 20 and counts every return,
  a nack too (4.0.5: gone after 21 looks); ``x-delivery-limit: -1`` lifts the
  limit, so a parking queue is declared with it.
* 4.3 counts only failed deliveries: ``basic.nack(requeue)`` does not count,
  whatever the limit; ``basic.reject`` and a closed channel do. A browse
  therefore hands every message back with a nack, never by closing.
* A queue's arguments cannot change (PRECONDITION_FAILED), so a parking queue
  declared before this (4.0 to 4.2: limit 20) is checked before a browse that
  would hand messages back, and refused with the fix:
  :func:`~celery_delayq.parking.queue.ParkingQueue.redeclare`.

The arguments a parking queue is declared with, per version, are the broker
edge's (:func:`celery_delayq.rabbitmq.delivery_limit.declare_arguments`): the
definitions export writes them too.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from ..rabbitmq.client import AccessRefused, Connection, PreconditionFailed
from ..rabbitmq.delivery_limit import DEFAULT_LIMIT_FROM, NACK_UNCOUNTED_FROM, declare_arguments
from .errors import UnsafeToBrowse

__all__ = ["browse_risk", "check_browsable"]

_INEQUIVALENT = re.compile(r"inequivalent arg '([^']+)'")


def browse_risk(connection: Connection, queue: str, version: tuple[int, ...]) -> str | None:
    """Why handing a message of the existing ``queue`` back could count towards a drop; ``None`` if it cannot.

    On 4.3+ a nack never counts. Before, the queue is declared again (on a
    scratch channel, so nothing changes) with a parking queue's quorum
    arguments: the broker accepts them, or names the first argument that
    differs. ``x-queue-type`` = not a quorum queue (no limit); ``x-delivery-limit``
    = a quorum queue with a limit; any other = unknown, which is a risk only
    where a default limit exists (4.0 to 4.2).
    """
    if version >= NACK_UNCOUNTED_FROM:
        return None
    expected = declare_arguments("quorum", version)
    ch = connection.channel()
    try:
        ch.queue_declare(queue, durable=True, auto_delete=False, arguments=expected)
        return None
    except PreconditionFailed as exc:
        found = _INEQUIVALENT.search(str(exc))
        arg = found.group(1) if found else None
    except AccessRefused:
        arg = "permission"  # a read-only user cannot declare: the limit is unknown
    finally:
        with contextlib.suppress(Exception):
            ch.close()
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
