"""QueueFollower on the real broker: consumes, survives a dropped connection, stops promptly."""

from __future__ import annotations

import time
from typing import Any

import amqp
import kombu

from celery_delayq.rabbitmq.following import QueueFollower
from test_connection_options import broker_connections, close_broker_connections


class Collecting(QueueFollower):
    role = "test follower"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bodies: list[str] = []

    def on_message(self, channel: amqp.Channel, message: amqp.Message) -> None:
        self.bodies.append(message.body.decode() if isinstance(message.body, bytes) else message.body)
        channel.basic_ack(message.delivery_tag)


def _wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_follows_a_queue_across_a_dropped_connection_and_stops_promptly(broker_url: str, amqp_conn, uid: str,
                                                                        caplog) -> None:
    queue = f"follow.{uid}"
    ch = amqp_conn.channel()
    ch.queue_declare(queue, durable=True, auto_delete=False)
    name = f"follower-{uid}"
    follower = Collecting(kombu.Connection(broker_url, transport_options={
        "client_properties": {"connection_name": name}}), queue, prefetch=10, thread_name="t-follow")
    follower.start()
    try:
        for i in range(3):
            ch.basic_publish(amqp.Message(f"a{i}"), routing_key=queue)
        assert _wait_for(lambda: len(follower.bodies) == 3, 10), follower.bodies
        assert _wait_for(lambda: broker_connections(name), 10)
        assert close_broker_connections(name) == 1  # as an operator (or a broker restart) would
        for i in range(3):
            ch.basic_publish(amqp.Message(f"b{i}"), routing_key=queue)
        assert _wait_for(lambda: len(follower.bodies) == 6, 20), follower.bodies
        assert "test follower lost" in caplog.text
    finally:
        start = time.time()
        follower.stop()
        stopped_in = time.time() - start
        ch.queue_delete(queue)
    assert sorted(follower.bodies) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert stopped_in < 2.5
