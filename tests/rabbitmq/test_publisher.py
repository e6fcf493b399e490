"""The kombu-level ladder publisher against the real broker: confirms, returns, nacks, timing."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import amqp
import kombu
import pytest

from celery_delayq.ladder import headers as H
from celery_delayq.config import DelayqConfig
from celery_delayq.errors import (
    DelayTooLong, InvalidDelay, PublishNacked, PublishReturned, TopologyMissing, UnroutableDestination,
)
from celery_delayq.rabbitmq.publisher import LadderPublisher
from helpers import drain, queue_depth, scheduler_of


@pytest.fixture
def publisher(broker_url: str, prefix: str):
    pub = LadderPublisher(kombu.Connection(broker_url), DelayqConfig(prefix=prefix))
    yield pub
    pub.close()


@pytest.fixture
def dest(amqp_conn: amqp.Connection, uid: str) -> str:
    name = f"dest.{uid}"
    amqp_conn.channel().queue_declare(name, durable=True, auto_delete=False)
    return name


def test_publish_to_queue_waits_and_is_never_early(publisher: LadderPublisher, amqp_conn, dest: str) -> None:
    delays = [0.05, 0.5, 1.9, 0.31, 1.0]
    for d in delays:
        scheduler_of(publisher).schedule_body({"d": d, "sent": time.time()}, delay=d, queue=dest)
    got = drain(amqp_conn, dest, len(delays), timeout=10)
    for m in got:
        due = m.headers[H.DUE]
        assert m.arrived >= due, f"early by {due - m.arrived:.4f} s"
        assert m.arrived - due < 5.0  # sanity only; lateness is measured in benchmarks/
        assert m.headers[H.DELAY] in delays


def test_publish_to_exchange_and_routing_key(publisher: LadderPublisher, amqp_conn, uid: str) -> None:
    ch = amqp_conn.channel()
    ch.exchange_declare(f"x.{uid}", "topic", durable=True, auto_delete=False)
    ch.queue_declare(f"a.{uid}", durable=True, auto_delete=False)
    ch.queue_declare(f"b.{uid}", durable=True, auto_delete=False)
    ch.queue_bind(f"a.{uid}", f"x.{uid}", "orders.*")
    ch.queue_bind(f"b.{uid}", f"x.{uid}", "#")
    scheduler_of(publisher).schedule_body("hello", delay=0.2, exchange=f"x.{uid}", routing_key="orders.eu")
    a = drain(amqp_conn, f"a.{uid}", 1, timeout=5)
    b = drain(amqp_conn, f"b.{uid}", 1, timeout=5)
    assert a[0].body == b[0].body and '"hello"' in str(a[0].body)
    assert a[0].delivery_info["routing_key"] == "orders.eu"  # the original key is restored


def test_headers_properties_and_priority_survive(publisher: LadderPublisher, amqp_conn, dest: str) -> None:
    scheduler_of(publisher).schedule_body({"x": 1}, delay=0.1, queue=dest, headers={"custom": "v", "n": 7},
                      priority=5, correlation_id="cid-1", reply_to="replies")
    m = drain(amqp_conn, dest, 1, timeout=5)[0]
    assert m.headers["custom"] == "v" and m.headers["n"] == 7
    assert m.properties["priority"] == 5
    assert m.properties["correlation_id"] == "cid-1" and m.properties["reply_to"] == "replies"
    assert m.properties["delivery_mode"] == 2


def test_a_per_message_ttl_is_dropped_so_it_cannot_expire_the_message_in_the_ladder(
        publisher: LadderPublisher, amqp_conn, dest: str) -> None:
    """``expiration`` reaches the backend (the producer hands it on); the ladder is the one place that drops it."""
    scheduler_of(publisher).schedule_body({"x": 1}, delay=0.5, queue=dest, expiration="50")
    m = drain(amqp_conn, dest, 1, timeout=5)[0]
    assert m.arrived >= m.headers[H.DUE] and "expiration" not in m.properties


def test_client_x_death_is_stripped_so_retries_are_not_cycle_dropped(publisher, amqp_conn, dest: str) -> None:
    # A message that already passed the ladder carries x-death for its queues; publish it again
    # through the same queues twice, as 30 retries would: it must arrive every time.
    m = None
    headers = {"x-death": [{"queue": publisher.spec.level_queue(3, 1), "reason": "expired", "count": 1,
                            "exchange": "", "routing-keys": ["k"]}],
               "x-first-death-queue": "whatever", "x-first-death-reason": "expired"}
    for _ in range(3):
        scheduler_of(publisher).schedule_body("again", delay=0.08, queue=dest, headers=headers)
        m = drain(amqp_conn, dest, 1, timeout=5)[0]
        headers = dict(m.headers)
    assert m is not None
    death_queues = [d["queue"] for d in m.headers["x-death"]]
    assert all(d["count"] == 1 for d in m.headers["x-death"]), m.headers["x-death"]
    assert "whatever" not in str(death_queues)


def test_unroutable_destination_fails_at_publish(publisher: LadderPublisher, uid: str) -> None:
    with pytest.raises(UnroutableDestination, match="no-such-queue"):
        scheduler_of(publisher).schedule_body("x", delay=1, queue=f"no-such-queue.{uid}")
    with pytest.raises(UnroutableDestination, match="no-such-exchange"):
        scheduler_of(publisher).schedule_body("x", delay=1, exchange=f"no-such-exchange.{uid}", routing_key="k")


def test_bad_delays_fail_before_publishing(publisher: LadderPublisher, dest: str, amqp_conn) -> None:
    with pytest.raises(InvalidDelay):
        scheduler_of(publisher).schedule_body("x", delay=float("nan"), queue=dest)
    with pytest.raises(DelayTooLong, match="never truncates"):
        scheduler_of(publisher).schedule_body("x", delay=10**12, queue=dest)  # longer than laps may go (100 years)
    assert scheduler_of(publisher).schedule_body("x", delay=-1, queue=dest) is None  # caller publishes now, as Celery
    assert queue_depth(amqp_conn, dest) == 0


@pytest.fixture
def private_publisher(broker_url: str, private_ladder):
    """A publisher on a ladder of the test's own (deleted afterwards), for tests that break it."""
    def factory(queue_type: str = "quorum") -> LadderPublisher:
        topo = private_ladder(queue_type, levels=8)
        pub = LadderPublisher(kombu.Connection(broker_url),
                              DelayqConfig(prefix=topo.spec.prefix, levels=8, queue_type=queue_type))
        made.append(pub)
        return pub
    made: list[LadderPublisher] = []
    yield factory
    for pub in made:
        pub.close()


def _break_level(publisher: LadderPublisher, conn: amqp.Connection, level: int) -> None:
    """Unbind level ``level``'s digit-1 queue from its level and its entry, so a digit 1 there routes nowhere (a
    broken ladder)."""
    publisher.declare()
    spec = publisher.spec
    queue = spec.level_queue(level, 1)
    for b in [b for b in spec.bindings() if b.destination == queue]:
        conn.channel().queue_unbind(b.destination, b.source, b.routing_key)


def test_unroutable_ladder_publish_is_returned_and_raised(private_publisher, amqp_conn, dest: str) -> None:
    publisher = private_publisher()
    spec = publisher.spec
    _break_level(publisher, amqp_conn, 4)
    # The destination's exit is ready first, so the publish below spends no time before it reads
    # the clock, and its delay (exactly one unit at level 4) stays exact.
    scheduler_of(publisher).schedule_body("warm", delay=0.02, queue=dest)
    with pytest.raises(PublishReturned, match="NOT scheduled"):
        scheduler_of(publisher).schedule_body("x", delay=spec.radix**4 * spec.unit_ms / 1000, queue=dest)  # digit 1 at level 4
    # the publisher is still usable afterwards
    assert scheduler_of(publisher).schedule_body("y", delay=0.02, queue=dest) is not None


def test_nacked_publish_raises_to_the_caller(private_publisher, vhost: str, dest: str) -> None:
    # A length-limit policy with reject-publish makes the broker nack.
    publisher = private_publisher("classic")
    publisher.declare()
    spec = publisher.spec
    policy = f"full-{uuid.uuid4().hex[:6]}"
    subprocess.run(["rabbitmqctl", "-q", "set_policy", "-p", vhost, "--apply-to", "queues", policy,
                    f"^{spec.level_queue(3, 1)}$", '{"max-length": 0, "overflow": "reject-publish"}'],
                   check=True, capture_output=True, timeout=60)
    try:
        deadline = time.time() + 15
        while True:  # the policy takes a moment to apply
            try:
                scheduler_of(publisher).schedule_body("x", delay=spec.radix**3 * spec.unit_ms / 1000, queue=dest)  # level 3
            except PublishNacked as exc:
                assert exc.failed and "NOT scheduled" in str(exc)
                break
            assert time.time() < deadline, "the broker never nacked"
            time.sleep(0.3)
        # other levels still work on the same publisher
        assert scheduler_of(publisher).schedule_body("y", delay=2 * spec.unit_ms / 1000, queue=dest) is not None
    finally:
        subprocess.run(["rabbitmqctl", "-q", "clear_policy", "-p", vhost, policy], capture_output=True, timeout=60)


def test_batch_pipelines_confirms_and_delivers_all(publisher, amqp_conn, dest: str) -> None:
    n = 2000
    with scheduler_of(publisher).batch():
        for i in range(n):
            scheduler_of(publisher).schedule_body(i, delay=0.2 + (i % 50) / 100, queue=dest)
    got = drain(amqp_conn, dest, n, timeout=30)
    assert sorted(int(m.body) for m in got) == list(range(n))
    assert all(m.arrived >= m.headers[H.DUE] for m in got)


def test_batch_raises_on_exit_when_a_message_was_refused(private_publisher, amqp_conn, dest: str) -> None:
    publisher = private_publisher()
    spec = publisher.spec
    _break_level(publisher, amqp_conn, 5)
    with pytest.raises(PublishReturned) as err:
        with scheduler_of(publisher).batch():
            scheduler_of(publisher).schedule_body("ok", delay=0.01, queue=dest)
            scheduler_of(publisher).schedule_body("bad", delay=spec.radix**5 * spec.unit_ms / 1000, queue=dest)  # level 5
            scheduler_of(publisher).schedule_body("ok2", delay=0.02, queue=dest)
    assert len(err.value.failed) == 1
    assert len(drain(amqp_conn, dest, 2, timeout=5)) == 2


def test_verify_only_publisher_refuses_a_missing_ladder(broker_url: str, dest: str, uid: str) -> None:
    pub = LadderPublisher(kombu.Connection(broker_url), DelayqConfig(prefix=f"absent{uid}", declare=False))
    with pytest.raises(TopologyMissing, match=f"absent{uid}"):
        scheduler_of(pub).schedule_body("x", delay=1, queue=dest)
    pub.close()


def test_verify_only_publisher_works_on_a_declared_ladder(publisher, broker_url: str, amqp_conn, dest: str) -> None:
    publisher.declare()
    verifying = LadderPublisher(kombu.Connection(broker_url), DelayqConfig(prefix=publisher.spec.prefix, declare=False))
    # the exit queue is part of what verify-only needs; the declaring publisher makes it
    scheduler_of(publisher).schedule_body("first", delay=0.01, queue=dest)
    assert scheduler_of(verifying).schedule_body("second", delay=0.02, queue=dest) is not None
    assert len(drain(amqp_conn, dest, 2, timeout=5)) == 2
    verifying.close()


def _entry_bindings_only(publisher: LadderPublisher, conn: amqp.Connection, level: int, *, keep: str) -> None:
    """Leave level ``level``'s digit-1 queue bound only from its entry exchange (``keep="entry"``) or only from
    its level exchange (``keep="level"``)."""
    publisher.declare()
    spec = publisher.spec
    queue, entry = spec.level_queue(level, 1), spec.entry_exchange_of(level, 1)
    for b in [b for b in spec.bindings() if b.destination == queue and (b.source == entry) != (keep == "entry")]:
        conn.channel().queue_unbind(b.destination, b.source, b.routing_key)


def test_a_publish_enters_through_its_first_queues_entry_exchange(private_publisher, amqp_conn, dest: str) -> None:
    """The level exchange's binding is not needed for the first hop (the entry's is), and the key the entry does
    not read still routes the later hops: digit 1 at level 3, then digit 1 at level 0."""
    publisher = private_publisher()
    spec = publisher.spec
    _entry_bindings_only(publisher, amqp_conn, 3, keep="entry")
    scheduler_of(publisher).schedule_body("warm", delay=0.02, queue=dest)
    units = spec.radix**3 + 1
    t0 = time.time()
    scheduler_of(publisher).schedule_body("through the entry", delay=units * spec.unit_ms / 1000, queue=dest)
    got = drain(amqp_conn, dest, 2, timeout=10)
    assert sorted(m.body for m in got) == ['"through the entry"', '"warm"']  # JSON bodies
    assert time.time() - t0 >= units * spec.unit_ms / 1000  # waited both hops: never early


def test_a_missing_entry_binding_is_returned_and_named(private_publisher, amqp_conn, dest: str) -> None:
    publisher = private_publisher()
    spec = publisher.spec
    _entry_bindings_only(publisher, amqp_conn, 4, keep="level")
    scheduler_of(publisher).schedule_body("warm", delay=0.02, queue=dest)
    with pytest.raises(PublishReturned, match="NOT scheduled"):
        scheduler_of(publisher).schedule_body("x", delay=spec.radix**4 * spec.unit_ms / 1000, queue=dest)


def test_verify_only_publisher_enters_an_older_ladder_through_its_levels(publisher, broker_url: str, amqp_conn,
                                                                          dest: str, caplog) -> None:
    """A ladder declared by 1.0.0rc1 or earlier has no entry exchanges; a process that may not add them
    (``delayq_declare = False``) publishes through the level exchanges, says so, and creates nothing."""
    publisher.declare()
    scheduler_of(publisher).schedule_body("first", delay=0.01, queue=dest)  # the exit queue, as above
    ch = amqp_conn.channel()
    for name in publisher.spec.entry_exchanges():
        ch.exchange_delete(name)
    verifying = LadderPublisher(kombu.Connection(broker_url), DelayqConfig(prefix=publisher.spec.prefix, declare=False))
    with caplog.at_level("WARNING", logger="celery_delayq"):
        assert scheduler_of(verifying).schedule_body("second", delay=0.05, queue=dest) is not None
    assert verifying.spec.entries == "topic"
    assert "has no entry exchanges" in caplog.text and "topology declare" in caplog.text
    assert len(drain(amqp_conn, dest, 2, timeout=5)) == 2
    with pytest.raises(amqp.NotFound):  # verifying created none of them
        amqp_conn.channel().exchange_declare(publisher.spec.entry_exchange_of(0, 1), "fanout", passive=True)
    verifying.close()
    publisher.topology.declare(amqp_conn)  # what `delayq topology declare` does: the entries are back
    again = LadderPublisher(kombu.Connection(broker_url), DelayqConfig(prefix=publisher.spec.prefix, declare=False))
    scheduler_of(again).schedule_body("third", delay=0.05, queue=dest)
    assert again.spec.entries == "fanout"
    assert len(drain(amqp_conn, dest, 1, timeout=5)) == 1
    again.close()


def test_exit_queue_uses_the_ladder_queue_type(publisher, amqp_conn, dest: str) -> None:
    sched = scheduler_of(publisher).schedule_body("x", delay=0.05, queue=dest)
    assert sched is not None and sched.destination.exit_queue.startswith(publisher.spec.prefix + ".exit.")
    # redeclaring with the same quorum arguments succeeds only if it is a quorum queue already
    args = publisher.topology.exit_queue_args("", dest)
    assert args["x-queue-type"] == "quorum" and args["x-message-ttl"] == 0
    amqp_conn.channel().queue_declare(sched.destination.exit_queue, durable=True, auto_delete=False, arguments=args)
    drain(amqp_conn, dest, 1, timeout=5)


def test_a_forked_child_publishes_over_a_connection_of_its_own(publisher: LadderPublisher, amqp_conn,
                                                               dest: str) -> None:
    scheduler_of(publisher).schedule_body("parent", delay=0.05, queue=dest)
    parents = publisher.link.raw
    pid = os.fork()
    if pid == 0:  # the child: never the parent's socket (a publisher made outside the registry: no fork hook)
        code = 1
        try:
            scheduler_of(publisher).schedule_body("child", delay=0.05, queue=dest)
            code = 0 if publisher.link.raw is not parents else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    scheduler_of(publisher).schedule_body("parent again", delay=0.05, queue=dest)
    assert publisher.link.raw is parents  # the parent's connection was left alone
    bodies = sorted(str(m.body).split('"')[1] for m in drain(amqp_conn, dest, 3, timeout=10))
    assert bodies == ["child", "parent", "parent again"]
