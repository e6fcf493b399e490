"""``LadderProducer``: the kombu-level hook.

The broker tests take the producer the two ways Celery does (the app's pool,
as ``apply_async`` does, and ``app.amqp.Producer(conn)``, as celery beat does)
and check on a real RabbitMQ that a delayed publish passes the ladder and an
undelayed one does not. The pure tests drive the producer through its own
seam: a :class:`~celery_delayq.typing.DelayRouting` and a
:class:`~celery_delayq.typing.Scheduling` that record what they are handed
(no broker is involved: nothing reaches a channel).
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

import amqp
import pytest
from kombu import Connection, Exchange, Queue

import celery_delayq
from celery_delayq.ladder import headers as H
from celery_delayq.glue.app_ladder import exchange_name
from celery_delayq.errors import InvalidName
from celery_delayq.glue.producer import LadderProducer, LadderProducerPool
from celery_delayq.typing import DelayRouting, Diversion
from helpers import drain

pytestmark = pytest.mark.timeout(60)

DELAY = 1.0


def _eta(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, tz=timezone.utc).isoformat()


def _publish_pair(producer: Any, queue: str, tag: str) -> float:
    """One publish due in DELAY seconds, then one due now, both as Celery sends them (keywords, headers)."""
    sent = time.time()
    producer.publish({"n": "later"}, routing_key=queue, exchange="", serializer="json",
                     headers={"task": "proj.add", "id": f"{tag}-later", "eta": _eta(DELAY)})
    producer.publish({"n": "now"}, routing_key=queue, exchange="", serializer="json",
                     headers={"task": "proj.add", "id": f"{tag}-now"})
    return sent


def _check_pair(conn: amqp.Connection, queue: str, tag: str, sent: float) -> None:
    got = drain(conn, queue, 2, timeout=20, key=lambda m: m.headers["id"])
    by_id = {m.headers["id"]: m for m in got}
    now, later = by_id[f"{tag}-now"], by_id[f"{tag}-later"]
    assert H.ENTRY not in now.headers, "the undelayed publish went through the ladder"
    assert now.arrived - sent < DELAY  # type: ignore[attr-defined]
    assert H.ENTRY in later.headers, "the delayed publish did not go through the ladder"
    assert later.arrived >= float(later.headers[H.DUE])  # type: ignore[attr-defined]  # never early
    assert json.loads(later.body) == {"n": "later"}


@pytest.fixture
def destination(amqp_conn: amqp.Connection, uid: str) -> Iterator[str]:
    name = f"prod.{uid}"
    ch = amqp_conn.channel()
    ch.queue_declare(name, durable=True, auto_delete=False)
    yield name
    ch.queue_delete(name)
    ch.close()


def test_the_apps_pool_gives_ladder_producers(make_app, amqp_conn: amqp.Connection, destination: str) -> None:
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app)
    with app.producer_pool.acquire(block=True) as producer:  # what apply_async does
        assert isinstance(producer, LadderProducer)
        sent = _publish_pair(producer, destination, "pool")
    _check_pair(amqp_conn, destination, "pool", sent)


def test_app_amqp_producer_is_a_ladder_producer(make_app, amqp_conn: amqp.Connection, destination: str) -> None:
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app)
    with app.connection_for_write() as conn:
        producer = app.amqp.Producer(conn)  # what celery beat does
        assert isinstance(producer, LadderProducer)
        sent = _publish_pair(producer, destination, "beat")
    _check_pair(amqp_conn, destination, "beat", sent)


def test_uninstall_gives_the_app_plain_producers_again(make_app) -> None:
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app)
    assert isinstance(app.producer_pool, LadderProducerPool)
    celery_delayq.uninstall(app)
    assert not isinstance(app.producer_pool, LadderProducerPool)
    with app.producer_pool.acquire(block=True) as producer:
        assert not isinstance(producer, LadderProducer)
    assert not isinstance(app.amqp.Producer(app.connection_for_write()), LadderProducer)


# -- pure: the producer's own logic, through its seam --------------------------------------
@dataclass
class RecordingScheduler:
    """A Scheduling (what the producer hands delayed messages to) that keeps what it is handed."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    @contextmanager
    def batch(self) -> Iterator[None]:
        yield

    def worker_service(self, connection_for: Callable[[str], Connection]) -> None:
        return None

    def schedule(self, body: bytes | str, *, due: float, delay: float, exchange: str, routing_key: str,
                 headers: dict[str, Any], content_type: str | None = None,
                 content_encoding: str | None = None, queue_hint: str | None = None,
                 **properties: Any) -> Any:
        self.calls.append(dict(body=body, due=due, delay=delay, exchange=exchange, routing_key=routing_key,
                               headers=headers, content_type=content_type,
                               content_encoding=content_encoding, queue_hint=queue_hint, **properties))
        return "scheduled"


@dataclass
class RecordingRouting:
    """A DelayRouting that delays every publish by 5 s (or refuses it), keeping what it was asked."""

    refuse: bool = False
    asked: list[tuple[Any, str | None, list[Any]]] = field(default_factory=list)
    scheduler: RecordingScheduler = field(default_factory=RecordingScheduler)

    def divert(self, headers: dict[str, Any], exchange: Any, routing_key: str | None,
               declare: Iterable[Any]) -> Diversion | None:
        self.asked.append((exchange, routing_key, list(declare)))
        if self.refuse:
            raise InvalidName("refused after looking")
        return Diversion(exchange_name(exchange), routing_key or "", due=2_000_000_005.0, delay=5.0)


def plugin_exchange(name: str = "delayed", real_type: str = "topic") -> Exchange:
    return Exchange(name, type="x-delayed-message", arguments={"x-delayed-type": real_type, "keep": 1})


@contextmanager
def unconnected_producer(make: Callable[[Connection], LadderProducer]) -> Iterator[LadderProducer]:
    # kombu binds a producer to a connection lazily: nothing here opens a socket.
    conn = Connection("amqp://guest:guest@127.0.0.1:1//")
    try:
        yield make(conn)
    finally:
        conn.release()


def test_recording_doubles_satisfy_the_protocols() -> None:
    routing = RecordingRouting()
    assert isinstance(routing, DelayRouting)


@pytest.mark.parametrize("positional", [True, False])
def test_a_plugin_exchange_given_to_the_producer_becomes_its_real_type(positional: bool) -> None:
    routing = RecordingRouting()

    def make(conn: Connection) -> LadderProducer:
        if positional:
            return LadderProducer(conn, plugin_exchange(), routing=routing, auto_declare=False)
        return LadderProducer(conn, exchange=plugin_exchange(), routing=routing, auto_declare=False)

    with unconnected_producer(make) as producer:
        assert (producer.exchange.name, producer.exchange.type) == ("delayed", "topic")
        assert producer.exchange.arguments == {"keep": 1}


def test_a_delayed_publish_to_a_plugin_exchange_is_serialised_and_handed_to_the_backend() -> None:
    routing = RecordingRouting()
    with unconnected_producer(lambda c: LadderProducer(c, routing=routing, auto_declare=False)) as producer:
        headers = {"task": "proj.add", "id": "p1", "x-delay": 5000}
        result = producer.publish({"x": 1}, routing_key="orders.new", exchange=plugin_exchange(),
                                  headers=headers, serializer="json", priority=0, expiration=60,
                                  correlation_id="c1")
    assert result == "scheduled"
    (exchange, key, declare), = routing.asked
    assert (exchange.name, exchange.type, key, declare) == ("delayed", "topic", "orders.new", [])
    (call,) = routing.scheduler.calls
    assert json.loads(call["body"]) == {"x": 1}
    assert (call["content_type"], call["content_encoding"]) == ("application/json", "utf-8")
    assert (call["exchange"], call["routing_key"], call["due"], call["delay"]) == (
        "delayed", "orders.new", 2_000_000_005.0, 5.0)
    assert call["headers"] is headers
    assert call["correlation_id"] == "c1" and call["delivery_mode"] == 2
    # The backend alone knows what a per-message TTL does there (the ladder drops it:
    # test_publisher.py); priority 0 is no priority.
    assert call["expiration"] == 60 and "priority" not in call


def test_declared_plugin_entities_reach_the_routing_as_their_real_type() -> None:
    routing = RecordingRouting(refuse=True)
    queue = Queue(f"q.{uuid.uuid4().hex[:6]}", plugin_exchange(real_type="direct"), routing_key="k")
    with unconnected_producer(lambda c: LadderProducer(c, routing=routing, auto_declare=False)) as producer:
        with pytest.raises(InvalidName):  # refused after looking: nothing is published
            producer.publish({"x": 1}, routing_key="k", exchange=queue.exchange, declare=[queue],
                             headers={"task": "t", "id": "p2", "x-delay": 1000}, serializer="json")
    (exchange, _, (declared,)), = routing.asked
    assert exchange.type == "direct"
    assert declared.name == queue.name and declared.exchange.type == "direct"
    assert queue.exchange.type == "x-delayed-message"  # the caller's own entity is not changed
