"""``Topology.inspect`` only looks; ``Topology.delete`` deletes only what exists, and nothing while messages wait."""

from __future__ import annotations

import amqp
import pytest

from celery_delayq.errors import TopologyError


def test_inspect_of_an_absent_ladder_creates_nothing(amqp_conn: amqp.Connection, private_ladder) -> None:
    topo = private_ladder(levels=2)
    state = topo.inspect(amqp_conn, extra_queues=["no.such.parking"])
    assert not state.exists and not state.complete and len(state.missing) == len(topo.entities()) + 1
    assert not topo.inspect(amqp_conn).exists  # still nothing after looking twice
    assert topo.delete(amqp_conn) == []


def test_inspect_counts_ready_messages(amqp_conn: amqp.Connection, private_ladder) -> None:
    topo = private_ladder(levels=2, unit_ms=1000)
    topo.declare(amqp_conn)
    ch = amqp_conn.channel()
    ch.confirm_select()
    ch.basic_publish_confirm(amqp.Message("w"), topo.spec.level_exchange(1), "3.0.tok")
    state = topo.inspect(amqp_conn)
    assert state.exists and state.complete
    assert state.queue(topo.spec.level_queue(1, 3)).messages == 1
    assert state.queue(topo.spec.level_queue(0, 1)).messages == 0


def test_delete_of_a_busy_ladder_deletes_nothing(amqp_conn: amqp.Connection, private_ladder) -> None:
    topo = private_ladder(levels=2, unit_ms=1000)
    topo.declare(amqp_conn)
    ch = amqp_conn.channel()
    ch.confirm_select()
    ch.basic_publish_confirm(amqp.Message("w"), topo.spec.level_exchange(1), "3.0.tok")
    with pytest.raises(TopologyError, match="nothing was deleted"):
        topo.delete(amqp_conn)
    assert topo.inspect(amqp_conn).complete  # exchanges too: the busy queue's dead-letter target stays
    deleted = topo.delete(amqp_conn, if_empty=False)
    assert len(deleted) == len(topo.entities()) and not topo.inspect(amqp_conn).exists


def test_delete_can_keep_what_every_shape_shares(amqp_conn: amqp.Connection, private_ladder) -> None:
    new = private_ladder(levels=3)
    old = private_ladder(prefix=new.spec.prefix, levels=2)
    new.declare(amqp_conn)
    old.declare(amqp_conn)
    assert not any("unroutable" in d for d in old.delete(amqp_conn, keep_shared=True))
    assert new.inspect(amqp_conn).complete
