"""Passive declares: does a queue or an exchange exist, how many messages wait in a queue; nothing is created.

Each on a throwaway channel (a 404 closes its channel); an exchange is probed whatever its type.
"""

from __future__ import annotations

from typing import Any, Callable

import amqp

from .client import throwaway_channel

__all__ = ["queue_depth", "queue_counts", "queue_exists", "exchange_exists", "destination_exists"]


def _passive(raw: amqp.Connection, declare: Callable[[amqp.Channel], Any]) -> tuple[Any] | None:
    """``(the declare's answer,)``, or ``None`` when the entity does not exist; on a throwaway channel."""
    with throwaway_channel(raw) as ch:
        try:
            return (declare(ch),)
        except amqp.NotFound:
            return None


def queue_depth(raw: amqp.Connection, queue: str) -> int | None:
    """Ready messages in ``queue``, or ``None`` when the queue does not exist."""
    found = queue_counts(raw, queue)
    return None if found is None else found[0]


def queue_counts(raw: amqp.Connection, queue: str) -> tuple[int, int] | None:
    """``(ready messages, consumers)`` of ``queue``, or ``None`` when the queue does not exist."""
    found = _passive(raw, lambda ch: ch.queue_declare(queue, passive=True))
    return None if found is None else (int(found[0].message_count), int(found[0].consumer_count))


def queue_exists(raw: amqp.Connection, queue: str) -> bool:
    """Does ``queue`` exist?"""
    return queue_depth(raw, queue) is not None


def exchange_exists(raw: amqp.Connection, exchange: str) -> bool:
    """Does ``exchange`` exist? (The default exchange, ``""``, always does.)"""
    return not exchange or _passive(raw, lambda ch: ch.exchange_declare(exchange, "direct", passive=True)) is not None


def destination_exists(raw: amqp.Connection, exchange: str, routing_key: str) -> bool:
    """Can a publish to ``exchange``/``routing_key`` land: the queue named by the key on the default exchange,
    else the exchange (whether it routes the key is the broker's business)."""
    return queue_exists(raw, routing_key) if not exchange else exchange_exists(raw, exchange)
