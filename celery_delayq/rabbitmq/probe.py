"""Passive declares: does a queue or an exchange exist, how many messages wait in a queue; nothing is created.

A passive declare of a missing entity fails with 404 NOT_FOUND, a channel
error that closes its channel; so every probe opens a throwaway channel of
its own and closes it, and the caller's channels never die of a probe.
RabbitMQ ignores every field but the name in a passive declare, so an
exchange is probed whatever its type.
"""

from __future__ import annotations

import contextlib

import amqp

__all__ = ["queue_depth", "queue_exists", "exchange_exists", "destination_exists"]


def queue_depth(raw: amqp.Connection, queue: str) -> int | None:
    """Ready messages in ``queue``, or ``None`` when the queue does not exist."""
    ch = raw.channel()
    try:
        return int(ch.queue_declare(queue, passive=True).message_count)
    except amqp.NotFound:
        return None
    finally:
        with contextlib.suppress(Exception):
            ch.close()


def queue_exists(raw: amqp.Connection, queue: str) -> bool:
    """Does ``queue`` exist?"""
    return queue_depth(raw, queue) is not None


def exchange_exists(raw: amqp.Connection, exchange: str) -> bool:
    """Does ``exchange`` exist? (The default exchange, ``""``, always does.)"""
    if not exchange:
        return True
    ch = raw.channel()
    try:
        ch.exchange_declare(exchange, "direct", passive=True)
        return True
    except amqp.NotFound:
        return False
    finally:
        with contextlib.suppress(Exception):
            ch.close()


def destination_exists(raw: amqp.Connection, exchange: str, routing_key: str) -> bool:
    """Can a publish to ``exchange``/``routing_key`` land: the queue named by the key on the default exchange,
    else the exchange (whether it routes the key is the broker's business)."""
    return queue_exists(raw, routing_key) if not exchange else exchange_exists(raw, exchange)
