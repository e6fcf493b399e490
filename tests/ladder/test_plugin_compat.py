"""Code written for the delayed-message plugin, unchanged, delayed through the ladder (real broker).

RabbitMQ 4.3 cannot run the plugin at all, and the machine's 3.10 does not
have it: on both, the plugin's exchange type does not exist, so these tests
show the code running where the plugin cannot.
"""

from __future__ import annotations

import time

import amqp
import pytest
from kombu import Exchange, Queue

from celery_delayq.errors import InvalidDelay
from celery_delayq.ladder.plugin_compat import delay_of, plain_entities
from helpers import drain

pytestmark = pytest.mark.timeout(60)


def plugin_exchange(name: str, real_type: str = "direct") -> Exchange:
    return Exchange(name, type="x-delayed-message", arguments={"x-delayed-type": real_type})


def test_kombu_publish_with_x_delay_waits_in_the_ladder(make_app, amqp_conn: amqp.Connection, uid: str) -> None:
    app = make_app(delayq_enabled=True)
    delayed = plugin_exchange(f"delayed.{uid}")
    queue = Queue(f"dq.{uid}", delayed, routing_key="k")
    sent = time.time()
    with app.producer_or_acquire() as producer:  # written the plugin's way, nothing else
        producer.publish({"n": 1}, exchange=delayed, routing_key="k", headers={"x-delay": 1500},
                         declare=[queue], serializer="json")
        producer.publish({"n": 2}, exchange=delayed, routing_key="k", declare=[queue], serializer="json")
    ch = amqp_conn.channel()
    try:
        got = drain(amqp_conn, f"dq.{uid}", 2, timeout=20)
        # By body, not by arrival order: where creating the ladder took longer than the 1.5 s (a
        # loaded machine), the delayed message is due by the time it is placed and may come first.
        (later,) = [m for m in got if '"n": 1' in str(m.body)]
        (now_msg,) = [m for m in got if '"n": 2' in str(m.body)]
        assert later.arrived - sent >= 1.5  # type: ignore[attr-defined]  # never early
        assert later.headers["x-delayq-exchange"] == f"delayed.{uid}"  # it went through the ladder
        assert "x-delayq-entry" not in (now_msg.headers or {})  # no x-delay: published as it was
    finally:
        ch.queue_delete(f"dq.{uid}")
        ch.exchange_delete(f"delayed.{uid}")
        ch.close()


def test_celery_apply_async_with_x_delay_header(make_app, collector) -> None:
    from helpers import running_worker

    app = make_app(delayq_enabled=True)

    @app.task(bind=True)
    def tick(self, sent: float) -> None:
        collector.add(waited=time.time() - sent, entry=self.request.get("x-delayq-entry"))

    with running_worker(app):
        tick.apply_async((time.time(),), headers={"x-delay": 1200})
        (run,) = collector.wait_for(1, timeout=20)
    assert run["waited"] >= 1.2 and run["entry"]


def test_bad_x_delay_is_refused_and_plugin_types_are_made_plain() -> None:
    assert delay_of({"x-delay": 2500}) == 2.5 and delay_of({}) is None
    with pytest.raises(InvalidDelay):
        delay_of({"x-delay": "soon"})
    (q,) = plain_entities([Queue("q", plugin_exchange("d", "topic"), routing_key="a.*")])
    assert q.exchange.type == "topic" and "x-delayed-type" not in (q.exchange.arguments or {})


def test_delivered_x_delay_is_negative_as_the_plugin_leaves_it(make_app, amqp_conn: amqp.Connection, uid: str) -> None:
    app = make_app(delayq_enabled=True)
    queue = Queue(f"dq.{uid}", plugin_exchange(f"delayed.{uid}"), routing_key="k")
    with app.producer_or_acquire() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="k", headers={"x-delay": 300},
                         declare=[queue], serializer="json")
    ch = amqp_conn.channel()
    try:
        (m,) = drain(amqp_conn, f"dq.{uid}", 1, timeout=10)
        assert m.headers["x-delay"] == -300  # republished as is, it is not delayed a second time
    finally:
        ch.queue_delete(f"dq.{uid}")
        ch.exchange_delete(f"delayed.{uid}")
        ch.close()
