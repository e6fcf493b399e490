"""Declaring and verifying the ladder on the real broker."""

from __future__ import annotations

import re

import amqp
import pytest

from celery_delayq.errors import BrokerTooOld, TopologyError, TopologyMismatch, TopologyMissing
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq.topology import Topology, resolve_queue_type
from celery_delayq.rabbitmq.client import broker_version
from helpers import BROKER_HOST, entity_exists


_exists = entity_exists


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_declare_is_idempotent_and_complete(amqp_conn: amqp.Connection, private_ladder, queue_type: str) -> None:
    topo = private_ladder(queue_type, levels=6)
    spec = topo.spec
    topo.declare(amqp_conn)
    topo.declare(amqp_conn)  # a second worker starting: no error, no change
    for _k, _d, name, _s in spec.level_queues():
        assert _exists(amqp_conn, "queue", name)
    for k in range(spec.levels):
        assert _exists(amqp_conn, "exchange", spec.level_exchange(k))
    assert _exists(amqp_conn, "exchange", spec.delivery_exchange)
    assert _exists(amqp_conn, "queue", spec.unroutable_queue)
    topo.verify(amqp_conn)  # verify-only accepts what declare made
    deleted = topo.delete(amqp_conn)
    assert f"queue {spec.level_queue(5, 1)}" in deleted
    assert not _exists(amqp_conn, "queue", spec.level_queue(0, 1))
    assert not _exists(amqp_conn, "exchange", spec.delivery_exchange)


def test_verify_only_names_what_is_missing(amqp_conn: amqp.Connection, private_ladder) -> None:
    topo = private_ladder(levels=4)
    with pytest.raises(TopologyMissing) as err:
        topo.verify(amqp_conn)
    spec = topo.spec
    assert spec.level_exchange(3) in str(err.value) and spec.delivery_exchange in str(err.value)
    assert not _exists(amqp_conn, "queue", spec.level_queue(0, 1))  # verify created nothing


def test_verify_names_a_partially_missing_ladder(amqp_conn: amqp.Connection, private_ladder) -> None:
    topo = private_ladder(levels=4)
    topo.declare(amqp_conn)
    gone = topo.spec.level_queue(2, 1)
    amqp_conn.channel().queue_delete(gone)
    with pytest.raises(TopologyMissing, match=re.escape(f"queue '{gone}'")):
        topo.verify(amqp_conn)


def test_changed_unit_is_a_clear_mismatch(amqp_conn: amqp.Connection, private_ladder) -> None:
    original = private_ladder(levels=4, unit_ms=10)
    original.declare(amqp_conn)
    changed = Topology(LadderSpec(prefix=original.spec.prefix, levels=4, unit_ms=20), "quorum")
    with pytest.raises(TopologyMismatch, match="x-message-ttl") as err:
        changed.verify(amqp_conn)
    assert "delayq_unit_ms" in str(err.value)
    with pytest.raises(TopologyMismatch, match="x-message-ttl"):
        changed.declare(amqp_conn)


def test_changed_queue_type_is_a_clear_mismatch(amqp_conn: amqp.Connection, private_ladder) -> None:
    classic = private_ladder("classic", levels=3)
    classic.declare(amqp_conn)
    with pytest.raises(TopologyMismatch, match="x-queue-type|queue_type"):
        Topology(classic.spec, "quorum").declare(amqp_conn)


def test_delete_keeps_queues_that_still_hold_messages(amqp_conn: amqp.Connection, private_ladder) -> None:
    topo = private_ladder(levels=3, unit_ms=1000)
    topo.declare(amqp_conn)
    ch = amqp_conn.channel()
    ch.confirm_select()
    ch.basic_publish_confirm(amqp.Message("waiting"), topo.spec.level_exchange(2), "1.0.0.tok")
    with pytest.raises(TopologyError, match="still hold messages"):
        topo.delete(amqp_conn)
    assert _exists(amqp_conn, "queue", topo.spec.level_queue(2, 1))


def test_broker_version_is_read(amqp_conn: amqp.Connection) -> None:
    assert broker_version(amqp_conn) >= (3, 10)


def test_queue_type_resolution_and_old_brokers() -> None:
    assert resolve_queue_type("auto", (3, 10, 8)) == "quorum"
    assert resolve_queue_type("auto", (3, 9, 29)) == "classic"
    assert resolve_queue_type("classic", (4, 3, 0)) == "classic"
    with pytest.raises(BrokerTooOld, match="3.10"):
        resolve_queue_type("quorum", (3, 8, 0))
    with pytest.raises(ValueError, match="delayq_queue_type"):
        resolve_queue_type("stream", (3, 10))


def test_publishers_starting_together_all_declare_a_new_ladder(vhost: str, private_ladder) -> None:
    """Four processes of a new app declaring at once: each succeeds (RabbitMQ 4.x answers one that
    meets a quorum queue another is still starting with 404 "home node ... is down or inaccessible")."""
    from concurrent.futures import ThreadPoolExecutor

    first = private_ladder(levels=14, radix=4, shards=2)
    others = [Topology(first.spec, "quorum") for _ in range(7)]

    def declare(topo: Topology) -> str:
        conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
        conn.connect()
        try:
            topo.declare(conn)
            return "ok"
        finally:
            conn.close()

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(declare, [first, *others]))
    assert outcomes == ["ok"] * 8


def test_only_a_queue_still_starting_elsewhere_is_declared_again() -> None:
    from celery_delayq.rabbitmq.topology import _racing_declares

    starting = amqp.NotFound("home node 'rabbit@h' of durable queue 'q' in vhost '/' is down or inaccessible")
    answers = [starting, starting, "declared"]

    def declare() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    for attempt in _racing_declares():
        with attempt:
            result = declare()
    assert result == "declared" and not answers
    with pytest.raises(amqp.NotFound, match="no exchange"):
        for attempt in _racing_declares():
            with attempt:
                raise amqp.NotFound("no exchange 'x' in vhost '/'")
