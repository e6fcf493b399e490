"""Bad destinations fail at publish with a specific error and lose nothing (real broker)."""

from __future__ import annotations

import time
from typing import Any

import amqp
import pytest

import celery_delayq
from celery_delayq.errors import InvalidName, UnroutableDestination
from helpers import drain, management_url

pytestmark = pytest.mark.timeout(60)



def test_too_long_a_queue_name_fails_before_any_broker_call(make_app) -> None:
    # A broker nobody listens on: InvalidName must come before any connection attempt.
    app = make_app(delayq_enabled=True, broker_url="amqp://guest:guest@127.0.0.1:1//")

    @app.task
    def add(x: int) -> int:
        return x

    started = time.monotonic()
    with pytest.raises(InvalidName, match="bytes long"):
        add.apply_async((1,), queue="q" * 300, countdown=5)
    assert time.monotonic() - started < 1.0


def test_exchange_without_a_binding_for_the_key_is_refused(make_app, amqp_conn: amqp.Connection, uid: str) -> None:
    ch = amqp_conn.channel()
    ch.exchange_declare(f"x.{uid}", "direct", durable=False, auto_delete=True)
    ch.queue_declare(f"bound.{uid}", durable=True, auto_delete=False)
    ch.queue_bind(f"bound.{uid}", f"x.{uid}", "good")
    app = make_app(delayq_enabled=True, delayq_management_url=management_url())

    @app.task
    def add(x: int) -> int:
        return x

    try:
        with pytest.raises(UnroutableDestination, match="no binding of that exchange routes"):
            add.apply_async((1,), exchange=f"x.{uid}", routing_key="nothing", countdown=5)
        # The same exchange with a bound key is delayed and delivered, never early.
        sent = time.time()
        add.apply_async((2,), exchange=f"x.{uid}", routing_key="good", countdown=1)
        (m,) = drain(amqp_conn, f"bound.{uid}", 1, timeout=15)
        assert m.arrived - sent >= 1.0 and "x-delayq-entry" in m.headers  # type: ignore[attr-defined]
    finally:
        ch.queue_delete(f"bound.{uid}")
        ch.close()


def test_without_the_management_api_it_warns_and_still_delivers_what_routes(
        make_app, amqp_conn: amqp.Connection, uid: str, caplog: Any) -> None:
    ch = amqp_conn.channel()
    ch.exchange_declare(f"x.{uid}", "topic", durable=False, auto_delete=True)
    ch.queue_declare(f"bound.{uid}", durable=True, auto_delete=False)
    ch.queue_bind(f"bound.{uid}", f"x.{uid}", "orders.#")
    app = make_app(delayq_enabled=True, delayq_management_url="http://127.0.0.1:1")
    # Without the API a new ladder is created only explicitly on RabbitMQ 3.x (celery_delayq.rabbitmq.budget).
    celery_delayq.ladder_for(app).publisher.declare(explicit=True)

    @app.task
    def add(x: int) -> int:
        return x

    try:
        add.apply_async((1,), exchange=f"x.{uid}", routing_key="orders.paid", countdown=0.5)
        (m,) = drain(amqp_conn, f"bound.{uid}", 1, timeout=15)
        assert "x-delayq-entry" in m.headers
        assert "cannot check that exchange" in caplog.text
    finally:
        ch.queue_delete(f"bound.{uid}")
        ch.close()
