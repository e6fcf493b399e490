"""A parked message survives any number of looks, on every broker, with the default declare.

RabbitMQ 4.x gives a quorum queue a delivery-limit of 20, and a message that
a browse hands back can count as a delivery (DESIGN-NOTES §7, §8).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Iterator

import amqp
import kombu
import pytest

from celery_delayq.parking import ParkedFilter, ParkingQueue, UnsafeToBrowse
from celery_delayq.rabbitmq.delivery_limit import declare_arguments
from celery_delayq.glue.request import RawMessage
from celery_delayq.parking.park import Parker, failure_headers, parking_message
from celery_delayq.rabbitmq.client import broker_version
from helpers import queue_depth

pytestmark = pytest.mark.timeout(120)

LOOKS = 50


@pytest.fixture
def quorum_name(amqp_conn: amqp.Connection, uid: str) -> Iterator[str]:
    """Name of a parking queue of this test, deleted afterwards (quorum queues cost file handles)."""
    name = f"qpark.{uid}"
    yield name
    with contextlib.suppress(Exception):
        amqp_conn.channel().queue_delete(name)


def park(broker_url: str, queue: str, count: int, *, queue_type: str = "auto", dest: str = "nowhere") -> list[str]:
    """Park ``count`` messages the way a worker does (Parker declares the queue); returns parked ids."""
    parker = Parker(kombu.Connection(broker_url), queue_type=queue_type)
    ids = []
    try:
        for i in range(count):
            task_id = uuid.uuid4().hex
            raw = RawMessage(body=json.dumps([[i], {}, {}]).encode(), exchange="", routing_key=dest,
                             headers={"task": "proj.t", "id": task_id, "retries": 1},
                             properties={"content_type": "application/json", "correlation_id": task_id})
            failure = failure_headers(task="proj.t", task_id=task_id, attempts=2, first_attempt=1.0,
                                      last_attempt=2.0, exc=IOError("x"), reason="exhausted",
                                      exchange="", routing_key=dest)
            parker.park(queue, parking_message(raw, failure))
            ids.append(failure["x-delayq-parked-id"])
    finally:
        parker.close()
    return ids


def test_a_default_parking_queue_survives_many_lists_and_inspects(broker_url: str, quorum_name: str) -> None:
    ids = park(broker_url, quorum_name, 3)
    with ParkingQueue(kombu.Connection(broker_url), quorum_name) as pq:
        for _ in range(LOOKS):
            assert [p.parked_id for p in pq.list()] == ids
            assert pq.get(ids[1][:12]).parked_id == ids[1]
            assert [p.parked_id for p in pq.list(limit=1)] == ids[:1]
        assert pq.count() == 3


def test_filtered_replay_and_purge_leave_the_rest_intact_however_often(
        broker_url: str, quorum_name: str, amqp_conn: amqp.Connection, uid: str) -> None:
    ids = park(broker_url, quorum_name, 2)
    with ParkingQueue(kombu.Connection(broker_url), quorum_name) as pq:
        for _ in range(LOOKS // 2):
            assert pq.purge(ParkedFilter(ids=("no-such-id",))) == 0
            report = pq.replay(ParkedFilter(ids=("no-such-id",)))
            assert (report.replayed, report.skipped) == (0, 2)
        assert [p.parked_id for p in pq.list()] == ids
    assert queue_depth(amqp_conn, quorum_name) == 2


def declare(conn: amqp.Connection, name: str, args: dict) -> None:
    ch = conn.channel()
    ch.queue_declare(name, durable=True, auto_delete=False, arguments=args)
    ch.close()


def declared_as(conn: amqp.Connection, name: str, args: dict) -> bool:
    """Does the existing queue have exactly these arguments? (a redeclare is refused otherwise)."""
    ch = conn.channel()
    try:
        ch.queue_declare(name, durable=True, auto_delete=False, arguments=args)
        return True
    except amqp.PreconditionFailed:
        return False
    finally:
        with contextlib.suppress(Exception):
            ch.close()


def test_new_parking_queues_have_no_delivery_limit(broker_url: str, quorum_name: str,
                                                   amqp_conn: amqp.Connection) -> None:
    park(broker_url, quorum_name, 1)
    version = broker_version(amqp_conn)
    expected = {"x-queue-type": "quorum"}
    if version >= (4, 0):
        expected["x-delivery-limit"] = -1  # 4.x's default is 20
    assert declared_as(amqp_conn, quorum_name, expected)  # 3.x: no argument, since 3.10 reads -1 as 0


def test_a_parking_queue_of_an_earlier_release_survives_or_is_refused_untouched(
        broker_url: str, quorum_name: str, amqp_conn: amqp.Connection) -> None:
    declare(amqp_conn, quorum_name, {"x-queue-type": "quorum"})  # as 34e400d declared it
    ids = park(broker_url, quorum_name, 2)
    version = broker_version(amqp_conn)
    with ParkingQueue(kombu.Connection(broker_url), quorum_name) as pq:
        if (4, 0) <= version < (4, 3):  # a default limit of 20, and every look counts
            with pytest.raises(UnsafeToBrowse, match=r"redeclare\(\)"):
                pq.list()
            assert pq.redeclare() == 2
        for _ in range(LOOKS):
            assert [p.parked_id for p in pq.list()] == ids


def test_an_explicit_delivery_limit_is_checked_before_any_look_and_redeclare_lifts_it(
        broker_url: str, quorum_name: str, amqp_conn: amqp.Connection) -> None:
    declare(amqp_conn, quorum_name, {"x-queue-type": "quorum", "x-delivery-limit": 3})
    ids = park(broker_url, quorum_name, 3)
    version = broker_version(amqp_conn)
    with ParkingQueue(kombu.Connection(broker_url), quorum_name) as pq:
        if version < (4, 3):  # a hand-back counts here, even a nack: refuse before taking anything
            for op in (pq.list, lambda: pq.get(ids[0]), lambda: pq.purge(ParkedFilter(task="x")),
                       lambda: pq.replay(ParkedFilter(task="x"))):
                with pytest.raises(UnsafeToBrowse, match=quorum_name):
                    op()
            ch = amqp_conn.channel()
            first = ch.basic_get(quorum_name, no_ack=False)
            assert first.headers.get("x-delivery-count", 0) == 0  # nothing was handed back before
            ch.close()
            assert pq.redeclare() == 3
        for _ in range(LOOKS):  # 4.3: a nack never counts, whatever the limit
            found = pq.list()
            assert [p.parked_id for p in found] == ids
        assert not any(k in p.headers for p in found for k in ("x-delivery-count", "x-acquired-count"))


def test_redeclare_keeps_every_message_in_order_and_can_be_run_again(
        broker_url: str, quorum_name: str, amqp_conn: amqp.Connection) -> None:
    declare(amqp_conn, quorum_name, {"x-queue-type": "quorum", "x-delivery-limit": 7})
    ids = park(broker_url, quorum_name, 120)
    with ParkingQueue(kombu.Connection(broker_url), quorum_name) as pq:
        assert pq.redeclare(batch_size=50) == 120
        assert declared_as(amqp_conn, quorum_name, declare_arguments("quorum", broker_version(amqp_conn)))
        assert pq.redeclare() == 120  # idempotent
        assert [p.parked_id for p in pq.list()] == ids
    ch = amqp_conn.channel()
    with pytest.raises(amqp.NotFound):
        ch.queue_declare(quorum_name + ".redeclare", passive=True)


def test_declare_arguments_per_broker_version() -> None:
    assert declare_arguments("quorum", (3, 10, 8)) == {"x-queue-type": "quorum"}
    assert declare_arguments("quorum", (4, 0, 5)) == {"x-queue-type": "quorum", "x-delivery-limit": -1}
    assert declare_arguments("quorum", (4, 3, 6)) == {"x-queue-type": "quorum", "x-delivery-limit": -1}
    assert declare_arguments("classic", (4, 3, 6)) == {"x-queue-type": "classic"}


def test_a_pass_longer_than_the_largest_prefetch_reads_the_rest_in_order(
        broker_url: str, quorum_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery_delayq.parking import scan

    monkeypatch.setattr(scan, "MAX_PREFETCH", 2)  # stands for 65,535 held messages
    monkeypatch.setattr(scan, "IDLE", 0.1)
    ids = park(broker_url, quorum_name, 7)
    with ParkingQueue(kombu.Connection(broker_url), quorum_name) as pq:
        for _ in range(3):
            assert [p.parked_id for p in pq.list()] == ids
            assert [p.parked_id for p in pq.list(limit=3)] == ids[:3]
        assert pq.purge(ParkedFilter(ids=(ids[0], ids[6]))) == 2
        assert [p.parked_id for p in pq.list()] == ids[1:6]
