"""``delayq_backend = "fixed"``: one TTL queue per destination and delay, one hop, the ladder beyond it.

The pure part (rounding, names, the choice of backend) needs no broker; the
rest runs real Celery workers on the test broker, so it runs on both lines.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, strategies as st
from kombu import Queue

import celery_delayq
from celery_delayq import cancel, pending
from celery_delayq.config import DelayqConfig
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq.fixed import FixedDelays, fixed_queue_name, fixed_queue_prefix, fixed_ttl_ms
from celery_delayq.scheduling import Scheduler
from celery_delayq.rabbitmq.topology import Topology
from helpers import Collector, queue_depth, running_worker

pytestmark = pytest.mark.timeout(180)

#: How late a fixed-queue message may arrive through a worker here: the rounding to the
#: resolution (a countdown of 2 s waits 2 s from the publish) plus one dead-lettering and
#: the worker's own latency; generous for a shared 2-core machine.
LATE_S = 0.75


# -- pure ---------------------------------------------------------------------------------
@given(st.floats(min_value=1e-6, max_value=600.0), st.sampled_from([0.01, 0.25, 1.0, 5.0]))
def test_the_ttl_is_rounded_up_to_the_resolution_never_down(remaining: float, resolution: float) -> None:
    ttl = fixed_ttl_ms(remaining, resolution_s=resolution, max_delay_s=10_000)
    assert ttl is not None
    assert ttl / 1000 >= remaining - 1e-6  # never early (to the microsecond the clock is read in)
    assert ttl / 1000 < remaining + resolution + 1e-3
    assert round(ttl / 1000 / resolution, 6) % 1 == 0  # a whole number of steps: few distinct queues


def test_noise_around_a_round_delay_shares_its_queue() -> None:
    assert {fixed_ttl_ms(d, resolution_s=1.0, max_delay_s=60) for d in (1.9993, 2.0, 2.0000000001)} == {2000}
    assert fixed_ttl_ms(2.001, resolution_s=1.0, max_delay_s=60) == 3000


def test_a_delay_beyond_the_max_or_not_positive_is_left_to_the_ladder() -> None:
    assert fixed_ttl_ms(30.0, resolution_s=1.0, max_delay_s=30) == 30000
    assert fixed_ttl_ms(30.2, resolution_s=1.0, max_delay_s=30) is None  # rounds to 31 s > max
    assert fixed_ttl_ms(0.0, resolution_s=1.0, max_delay_s=30) is None
    assert fixed_ttl_ms(-1.0, resolution_s=1.0, max_delay_s=30) is None


def test_queue_names_carry_delay_and_destination_and_share_the_prefix() -> None:
    spec = LadderSpec(prefix="px")
    dest = Topology(spec, "quorum").destination("", "emails")
    name = fixed_queue_name(spec, dest, 2000)
    assert name.startswith(fixed_queue_prefix("px") + "2000ms.") and name.endswith(dest.token)
    assert fixed_queue_name(spec, dest, 4000) != name
    assert fixed_queue_name(spec, Topology(spec, "quorum").destination("", "sms"), 2000) != name


def test_queue_backends_are_checked_and_hashable() -> None:
    config = DelayqConfig(queue_backends={"emails": "fixed", "b": "ladder"})
    assert config.queue_backends == (("b", "ladder"), ("emails", "fixed"))
    hash(config)
    with pytest.raises(ValueError, match=r"delayq_queue_backends\['emails'\]"):
        DelayqConfig(queue_backends={"emails": "fast"})
    with pytest.raises(ValueError, match="delayq_fixed_resolution"):
        DelayqConfig(fixed_resolution=0)


def test_the_scheduler_chooses_by_the_destination_queue() -> None:
    default, fixed = object(), object()
    s = Scheduler(DelayqConfig(), default, {"emails": fixed})  # type: ignore[arg-type]
    assert s.backend_for("", "emails", None) is fixed  # default exchange: the key names the queue
    assert s.backend_for("tasks", "emails", "emails") is fixed  # Celery named the queue
    assert s.backend_for("tasks", "emails", None) is default  # an exchange's key is not a queue name
    assert s.backend_for("", "other", None) is default


# -- broker -------------------------------------------------------------------------------
def _fixed(app: Any) -> FixedDelays:
    backend = celery_delayq.ladder_for(app).backend
    assert isinstance(backend, FixedDelays)
    return backend


def test_a_countdown_through_fixed_takes_one_hop_and_is_never_early(
        make_app, collector: Collector, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="fixed")

    @app.task(bind=True)
    def probe(self: Any, due: float) -> None:
        collector.add(due=due, hops=(self.request.headers or {}).get("x-delayq-hops"))

    with running_worker(app):
        sent = [probe.apply_async((time.time() + 2,), countdown=2) for _ in range(3)]
        runs = collector.wait_for(3, timeout=30)
    assert len(sent) == 3
    assert all(r["at"] >= r["due"] for r in runs), runs  # never early
    assert max(r["at"] - r["due"] for r in runs) < LATE_S, runs
    receipts = [plan for plan, _ in placed]
    assert [p.hops for p in receipts] == [1, 1, 1]
    assert {p.routing_key for p in receipts} == set(_fixed(app).queues.values())  # one queue for all three
    assert all(p.routing_key.startswith(fixed_queue_prefix(app.conf.delayq_prefix) + "2000ms.") for p in receipts)
    assert all(h["x-delayq-hops"] == 1 for _, h in placed)


def test_a_short_delay_is_not_held_behind_a_long_one(make_app, collector: Collector, amqp_conn,
                                                      placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="fixed")

    @app.task
    def probe(tag: str, due: float) -> None:
        collector.add(tag=tag, due=due)

    with running_worker(app):
        probe.apply_async(("long", time.time() + 30), countdown=30)
        probe.apply_async(("short", time.time() + 1), countdown=1)
        [run] = collector.wait_for(1, timeout=10)
    assert run["tag"] == "short" and run["due"] <= run["at"] < run["due"] + LATE_S
    long_queue, short_queue = (plan.routing_key for plan, _ in placed)
    assert long_queue != short_queue and "30000ms" in long_queue
    assert queue_depth(amqp_conn, long_queue) == 1  # still waiting there
    amqp_conn.channel().queue_purge(long_queue)


def test_a_delay_that_does_not_fit_goes_through_the_ladder(make_app, collector: Collector, caplog,
                                                            placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="fixed", delayq_fixed_max_delay=1.0,
                   delayq_fixed_queues=1, delayq_fixed_resolution=0.5)

    @app.task
    def probe(tag: str, due: float) -> None:
        collector.add(tag=tag, due=due)

    with caplog.at_level("INFO", logger="celery_delayq.rabbitmq.fixed"), running_worker(app):
        probe.apply_async(("fits", time.time() + 1), countdown=1)
        probe.apply_async(("too long", time.time() + 1.5), countdown=1.5)  # 1.5 s > fixed_max_delay
        probe.apply_async(("too many", time.time() + 0.5), countdown=0.5)  # a second distinct delay (0.5 s)
        runs = collector.wait_for(3, timeout=30)
    assert all(r["at"] >= r["due"] for r in runs), runs
    first, *rest = (plan for plan, _ in placed)
    assert first.hops == 1 and all(p.hops > 1 for p in rest), placed  # the ladder's hops (levels + exit)
    assert all(not p.routing_key.startswith(fixed_queue_prefix(app.conf.delayq_prefix)) for p in rest)
    said = [r.getMessage() for r in caplog.records]
    assert any("delayq_fixed_max_delay" in m for m in said) and any("delayq_fixed_queues" in m for m in said)


def test_the_backend_is_chosen_per_destination_queue(make_app, uid: str, collector: Collector,
                                                      placed: list[tuple[Any, dict[str, Any]]]) -> None:
    emails = f"emails.{uid}"
    app = make_app(delayq_enabled=True, delayq_queue_backends={emails: "fixed"},
                   task_queues=[Queue(f"q.{uid}"), Queue(emails)])

    @app.task
    def probe(tag: str, due: float) -> None:
        collector.add(tag=tag, due=due)

    with running_worker(app):
        probe.apply_async(("email", time.time() + 1), countdown=1, queue=emails)
        probe.apply_async(("other", time.time() + 1), countdown=1)
        runs = collector.wait_for(2, timeout=30)
    assert all(r["at"] >= r["due"] for r in runs), runs
    by_queue = {plan.destination.routing_key: plan.hops for plan, _ in placed}
    assert by_queue[emails] == 1 and by_queue[f"q.{uid}"] > 1


def test_a_task_waiting_in_a_fixed_queue_is_pending_and_can_be_cancelled(
        make_app, collector: Collector, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="fixed")

    @app.task
    def job(tag: str) -> None:
        collector.add(tag=tag)

    with running_worker(app):
        # 8 s: each pending() below reads the session's whole index (thousands of other tests' tasks in a
        # full run), seconds apiece on a loaded host; the cancel must come before the due time.
        doomed = job.apply_async(("doomed",), countdown=8)
        kept = job.apply_async(("kept",), countdown=8)
        assert {plan.hops for plan, _ in placed} == {1}  # both wait in the fixed queue
        assert sorted(t.task_id for t in pending(app, task=job.name)) == sorted([doomed.id, kept.id])
        [result] = cancel(app, doomed.id)
        assert result.found is not None and result.found.task_id == doomed.id
        assert [t.task_id for t in pending(app, task=job.name)] == [kept.id]
        collector.wait_for(1, timeout=20)
        time.sleep(1.0)  # the doomed one came due with it: it must not run
    assert [r["tag"] for r in collector.items] == ["kept"]
