"""Passive-declare probes: they tell what exists and how full a queue is, create nothing, and never close the
caller's channel (a failed passive declare closes its own). Real broker."""

from __future__ import annotations

import amqp

from celery_delayq.rabbitmq.probe import destination_exists, exchange_exists, queue_depth, queue_exists


def test_probes_tell_what_exists_and_create_nothing(amqp_conn: amqp.Connection, uid: str) -> None:
    queue, exchange = f"probe.q.{uid}", f"probe.x.{uid}"
    mine = amqp_conn.channel()  # the caller's channel: a probe of a missing entity must not close it
    assert queue_depth(amqp_conn, queue) is None and not queue_exists(amqp_conn, queue)
    assert not exchange_exists(amqp_conn, exchange) and not destination_exists(amqp_conn, exchange, "k")
    assert not destination_exists(amqp_conn, "", queue)
    assert mine.is_open
    assert queue_depth(amqp_conn, queue) is None and not exchange_exists(amqp_conn, exchange)  # still nothing made

    mine.queue_declare(queue, durable=False, auto_delete=False)
    mine.exchange_declare(exchange, "topic", durable=False, auto_delete=False)  # any type: passive ignores it
    try:
        mine.confirm_select()
        for _ in range(2):
            mine.basic_publish_confirm(amqp.Message("x"), "", queue)
        assert queue_depth(amqp_conn, queue) == 2 and queue_exists(amqp_conn, queue)
        assert exchange_exists(amqp_conn, exchange) and destination_exists(amqp_conn, exchange, "any.key")
        assert destination_exists(amqp_conn, "", queue)
        assert exchange_exists(amqp_conn, "")  # the default exchange always exists
    finally:
        mine.queue_delete(queue)
        mine.exchange_delete(exchange)
        mine.close()
