"""The quorum queues' delivery limit, by RabbitMQ version: how a parking queue is declared (pure).

A look hands each message back, on some versions a delivery (:mod:`celery_delayq.parking.limits`);
the parker, the redeclare and the export take the declare arguments from here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["declare_arguments", "DEFAULT_LIMIT_FROM", "NACK_UNCOUNTED_FROM"]

#: First RabbitMQ version that gives quorum queues a default delivery-limit (20).
DEFAULT_LIMIT_FROM = (4, 0)
#: First RabbitMQ version on which ``basic.nack(requeue)`` does not count as a delivery.
NACK_UNCOUNTED_FROM = (4, 3)


def declare_arguments(queue_type: str, version: tuple[int, ...]) -> dict[str, Any]:
    """The declare arguments of a parking queue of ``queue_type`` on RabbitMQ ``version`` (pure).

    A quorum queue gets no delivery limit: ``x-delivery-limit: -1`` from 4.0
    on, no argument before (3.x has no default, and reads -1 as a limit of 0).
    """
    args: dict[str, Any] = {"x-queue-type": queue_type}
    if queue_type == "quorum" and version >= DEFAULT_LIMIT_FROM:
        args["x-delivery-limit"] = -1
    return args
