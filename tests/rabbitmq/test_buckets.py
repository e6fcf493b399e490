"""``delayq_backend = "buckets"``: one queue per destination and due slice, one hop, the ladder beyond it.

The pure part (slices, leases, names) needs no broker; the rest runs real Celery workers on the test broker, so
it runs on both lines (the per-message TTL and ``x-expires`` of quorum queues included).
"""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import datetime
from typing import Any

import amqp
import pytest
from hypothesis import given, strategies as st

import celery_delayq
from celery_delayq import cancel, pending
from celery_delayq.config import DelayqConfig
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq import buckets as buckets_module
from celery_delayq.rabbitmq.buckets import (ALIVE_3X, ALIVE_4X, LEASE_STEP_S, RECURRING_DELAYS, RECURRING_WINDOW_S, SHARDS_3X,
                                            SHARDS_4X, Bucket, DueBuckets, bucket_for, bucket_queue_name,
                                            bucket_queue_prefix, recurring_for)
from celery_delayq.rabbitmq.client import broker_version
from celery_delayq.rabbitmq.topology import Topology, ladder_role
from helpers import Collector, drain, queue_depth, running_worker

pytestmark = pytest.mark.timeout(180)

#: How late a bucket's message may arrive through a worker here beyond its slice end: one dead-lettering and
#: the worker's own latency; generous for a shared 2-core machine.
LATE_S = 0.75

NOW = 1_790_000_000.25


# -- pure ---------------------------------------------------------------------------------
@given(st.floats(min_value=1e-3, max_value=600.0), st.sampled_from([0.01, 0.25, 1.0, 5.0]),
       st.floats(min_value=0, max_value=1000))
def test_a_message_expires_at_its_slice_end_never_before_its_due_time(delay: float, width: float,
                                                                      offset: float) -> None:
    now = NOW + offset
    bucket = bucket_for(now + delay, now, width_s=width, max_delay_s=10_000, grace_s=900)
    assert bucket is not None
    assert bucket.expiration_ms / 1000 >= delay - 1e-6  # never early
    assert bucket.expiration_ms / 1000 < delay + width + 2e-3  # at most one slice late
    assert round(bucket.slice_end_ms / 1000 / width, 6) % 1 == 0  # a slice end: shared by every publisher
    assert abs((now * 1000 + bucket.expiration_ms) - bucket.slice_end_ms) <= 1  # the TTL ends at the slice end


@given(st.floats(min_value=0.5, max_value=600.0), st.floats(min_value=0, max_value=600.0),
       st.floats(min_value=1, max_value=3600))
def test_the_lease_outlives_the_slice_by_the_grace_and_not_much_more(delay: float, later: float, grace: float) -> None:
    """Whoever declares the queue of a given name (same slice, same lease) last, the broker keeps it until its
    slice end plus the grace, and drops it at most a lease step after that."""
    due = NOW + 600 + delay
    first = bucket_for(due, NOW, width_s=1.0, max_delay_s=10_000, grace_s=grace)
    assert first is not None
    for declared_at in (NOW, NOW + later):
        b = bucket_for(due, declared_at, width_s=1.0, max_delay_s=10_000, grace_s=grace)
        assert b is not None
        if b.lease_ms != first.lease_ms:
            continue  # another lease: another queue
        deleted_at_ms = declared_at * 1000 + b.lease_ms
        assert deleted_at_ms >= b.slice_end_ms + grace * 1000 - 1
        assert deleted_at_ms <= b.slice_end_ms + grace * 1000 + LEASE_STEP_S * 1000 + 1


def test_a_burst_published_over_a_minute_toward_one_second_shares_one_queue() -> None:
    due = NOW + 120.4
    end = 1_790_000_121.0  # due (…120.65) rounded up to the second
    got = {bucket_for(due, NOW + 60.75 + k * 0.45, width_s=1.0, max_delay_s=600, grace_s=900) for k in range(100)}
    assert {(b.slice_end_ms, b.lease_ms) for b in got if b is not None} == {(round(end * 1000), 1_200_000)}


def test_a_delay_beyond_the_max_or_not_positive_is_left_to_the_ladder() -> None:
    assert bucket_for(NOW + 29.5, NOW, width_s=1.0, max_delay_s=30, grace_s=60) is not None
    assert bucket_for(NOW + 30.2, NOW, width_s=1.0, max_delay_s=30, grace_s=60) is None  # its slice ends at 31 s
    assert bucket_for(NOW, NOW, width_s=1.0, max_delay_s=30, grace_s=60) is None
    assert bucket_for(NOW - 1, NOW, width_s=1.0, max_delay_s=30, grace_s=60) is None
    assert bucket_for(float("inf"), NOW, width_s=1.0, max_delay_s=30, grace_s=60) is None


def test_queue_names_carry_slice_lease_shard_and_destination_and_are_the_ladders() -> None:
    spec = LadderSpec(prefix="px")
    dest = Topology(spec, "quorum").destination("", "emails")
    bucket = Bucket(1_790_000_121_000, 120_750, 1_200_000)
    name = bucket_queue_name(spec, dest, bucket, 3)
    assert name.startswith(bucket_queue_prefix("px") + "1790000121000.1200s.3.") and name.endswith(dest.token)
    assert bucket_queue_name(spec, dest, bucket._replace(slice_end_ms=1_790_000_122_000), 3) != name
    assert bucket_queue_name(spec, dest, bucket, 0) != name
    assert bucket_queue_name(spec, Topology(spec, "quorum").destination("", "sms"), bucket, 3) != name
    assert ladder_role("px", "queue", name) == ("buckets", "")  # `delayq topology delete` removes it
    assert ladder_role("px", "queue", name.replace(".1200s.", ".1200.")) is None


@given(st.floats(min_value=1e-4, max_value=29.99), st.floats(min_value=0, max_value=10_000),
       st.sampled_from([1, 10, 100]))
def test_a_recurring_delay_is_rounded_as_the_ladder_rounds_and_never_early(delay: float, offset: float,
                                                                           unit: int) -> None:
    now = NOW + offset
    found = recurring_for(delay, now, unit_ms=unit, window_s=600, under_s=30, grace_s=900)
    assert found is not None
    assert found.expiration_ms == LadderSpec(unit_ms=unit, levels=8).units_for(delay) * unit  # the ladder's rounding
    assert found.expiration_ms / 1000 >= delay - 1e-6  # never early
    assert found.slice_end_ms % 600_000 == 0 and 0 < found.slice_end_ms - now * 1000 <= 600_000  # its window


@given(st.floats(min_value=0, max_value=599.999), st.floats(min_value=0, max_value=599.999),
       st.floats(min_value=1e-3, max_value=29.99))
def test_a_recurring_queue_outlives_its_windows_last_message_by_the_grace(created: float, last: float,
                                                                         delay: float) -> None:
    """Whoever creates a window's queue (x-expires counts from creation, a redeclare does not renew it), it
    lives until the last message of the window has expired plus the grace."""
    start = 1_790_000_400.0  # a window start (a multiple of 600 s)
    first = recurring_for(delay, start + created, unit_ms=10, window_s=600, under_s=30, grace_s=900)
    latest = recurring_for(delay, start + last, unit_ms=10, window_s=600, under_s=30, grace_s=900)
    assert first is not None and latest is not None and first == latest  # one queue, whoever declares it
    expires_at_ms = (start + created) * 1000 + first.lease_ms
    assert expires_at_ms >= (start + last) * 1000 + latest.expiration_ms + 900_000


def test_only_a_short_positive_delay_can_recur() -> None:
    assert recurring_for(29.9, NOW, unit_ms=10, window_s=600, under_s=30, grace_s=900) is not None
    assert recurring_for(30.0, NOW, unit_ms=10, window_s=600, under_s=30, grace_s=900) is None  # a bucket's
    assert recurring_for(0.0, NOW, unit_ms=10, window_s=600, under_s=30, grace_s=900) is None
    assert recurring_for(-1.0, NOW, unit_ms=10, window_s=600, under_s=30, grace_s=900) is None
    assert recurring_for(float("nan"), NOW, unit_ms=10, window_s=600, under_s=30, grace_s=900) is None
    assert recurring_for(1.0, NOW, unit_ms=10, window_s=600, under_s=0, grace_s=900) is None


@given(st.floats(min_value=30.0, max_value=599.98), st.floats(min_value=0, max_value=599.999),
       st.floats(min_value=0, max_value=599.999))
def test_a_long_recurring_delay_has_the_ladders_precision_and_its_queue_outlives_the_window(
        delay: float, created: float, last: float) -> None:
    """A long delay repeated (up to delayq_bucket_max_delay) recurs too: rounded up to the unit, never early, and
    its queue (whoever creates it in the window) lives past the window's last message by the grace."""
    start = 1_790_000_400.0
    first = recurring_for(delay, start + created, unit_ms=10, window_s=600, under_s=600, grace_s=900)
    latest = recurring_for(delay, start + last, unit_ms=10, window_s=600, under_s=600, grace_s=900)
    assert first is not None and first == latest
    assert first.expiration_ms == LadderSpec(unit_ms=10).units_for(delay) * 10 and first.expiration_ms >= delay * 1000
    assert (start + created) * 1000 + first.lease_ms >= (start + last) * 1000 + first.expiration_ms + 900_000
    short = recurring_for(2.0, start, unit_ms=10, window_s=600, under_s=30, grace_s=900)
    assert short is not None and short.lease_ms != first.lease_ms  # the two families never share a queue name
    assert recurring_for(600.0, start, unit_ms=10, window_s=600, under_s=600, grace_s=900) is None  # a bucket's
    assert recurring_for(599.995, start, unit_ms=10, window_s=600, under_s=599.991, grace_s=900) is None  # rounded


def test_a_recurring_queue_is_named_by_its_delay_and_is_the_ladders() -> None:
    spec = LadderSpec(prefix="px")
    dest = Topology(spec, "quorum").destination("", "emails")
    found = recurring_for(2.0, NOW, unit_ms=10, window_s=600, under_s=30, grace_s=900)
    assert found is not None
    name = bucket_queue_name(spec, dest, found, 1, recurring=True)
    assert ".1.2000ms." in name and name != bucket_queue_name(spec, dest, found, 1)
    assert bucket_queue_name(spec, dest, found._replace(expiration_ms=3000), 1, recurring=True) != name
    assert ladder_role("px", "queue", name) == ("buckets", "")  # `delayq topology delete` removes it


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="delayq_bucket_width"):
        DelayqConfig(bucket_width=0)
    with pytest.raises(ValueError, match="delayq_bucket_grace"):
        DelayqConfig(bucket_grace=0.5)
    assert DelayqConfig(backend="buckets").backend == "buckets"
    with pytest.raises(ValueError, match="delayq_recurring_after"):
        DelayqConfig(recurring_after=-1)


# -- broker -------------------------------------------------------------------------------
def _buckets(app: Any) -> DueBuckets:
    backend = celery_delayq.ladder_for(app).backend
    assert isinstance(backend, DueBuckets)
    return backend


def _slice_end(due: float, width: float = 1.0) -> float:
    return -(-round(due * 1000) // round(width * 1000)) * width


def test_tasks_due_in_one_slice_wait_in_one_queue_one_hop_and_run_at_its_end(
        make_app, collector: Collector, amqp_conn, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_shards=1,
                   delayq_bucket_after=0)

    @app.task(bind=True)
    def probe(self: Any, due: float) -> None:
        collector.add(due=due, hops=(self.request.headers or {}).get("x-delayq-hops"))

    with running_worker(app):
        due = time.time() + 3
        sent = []
        for _ in range(3):  # published at different moments, toward one due second
            sent.append(probe.apply_async((due,), eta=due))
            time.sleep(0.3)
        queue = placed[0][0].routing_key
        assert queue_depth(amqp_conn, queue) == 3  # all three wait in the bucket
        runs = collector.wait_for(3, timeout=30)
    assert len(sent) == 3
    end = _slice_end(due)
    assert all(r["at"] >= r["due"] and r["at"] >= end - 0.01 for r in runs), runs  # never early, not before the end
    assert max(r["at"] - end for r in runs) < LATE_S, runs
    receipts = [plan for plan, _ in placed]
    assert [p.hops for p in receipts] == [1, 1, 1]
    assert {p.routing_key for p in receipts} == {queue} == set(_buckets(app).alive)
    assert queue.startswith(bucket_queue_prefix(app.conf.delayq_prefix) + f"{round(end * 1000)}.")
    assert all(h["x-delayq-hops"] == 1 for _, h in placed)
    four = broker_version(amqp_conn) >= (4, 0)  # unset delayq_bucket_queues: by broker line
    assert _buckets(app)._limit() == (ALIVE_4X if four else ALIVE_3X)
    assert _buckets(app)._shards() == 1  # set
    unset = DueBuckets(_buckets(app).ladder)
    unset.config = dataclasses.replace(unset.config, bucket_shards=None)
    assert unset._shards() == (SHARDS_4X if four else SHARDS_3X)  # unset: by line


def test_a_short_delay_is_not_held_behind_a_long_one(make_app, collector: Collector, amqp_conn,
                                                      placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_after=0)

    @app.task
    def probe(tag: str, due: float) -> None:
        collector.add(tag=tag, due=due)

    with running_worker(app):
        probe.apply_async(("long", time.time() + 30), countdown=30)
        probe.apply_async(("short", time.time() + 1), countdown=1)
        [run] = collector.wait_for(1, timeout=10)
    assert run["tag"] == "short" and run["due"] <= run["at"] < _slice_end(run["due"]) + LATE_S
    long_queue, short_queue = (plan.routing_key for plan, _ in placed)
    assert long_queue != short_queue
    assert queue_depth(amqp_conn, long_queue) == 1  # still waiting there
    amqp_conn.channel().queue_delete(long_queue)


def test_what_does_not_fit_goes_through_the_ladder(make_app, collector: Collector, caplog,
                                                   placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_max_delay=2.0,
                   delayq_bucket_queues=1, delayq_bucket_width=0.5, delayq_bucket_after=0, delayq_bucket_shards=1)

    @app.task
    def probe(tag: str, due: float) -> None:
        collector.add(tag=tag, due=due)

    with caplog.at_level("INFO", logger="celery_delayq.rabbitmq.fixed"), running_worker(app):
        probe.apply_async(("fits", time.time() + 1.2), countdown=1.2)
        probe.apply_async(("too long", time.time() + 2.6), countdown=2.6)  # beyond delayq_bucket_max_delay
        probe.apply_async(("too many", time.time() + 0.3), countdown=0.3)  # another slice: a second queue
        runs = collector.wait_for(3, timeout=30)
    assert all(r["at"] >= r["due"] for r in runs), runs
    first, *rest = (plan for plan, _ in placed)
    assert first.hops == 1 and all(p.hops > 1 for p in rest), placed  # the ladder's hops (levels + exit)
    assert all(not p.routing_key.startswith(bucket_queue_prefix(app.conf.delayq_prefix)) for p in rest)
    said = [r.getMessage() for r in caplog.records]
    assert any("not a due-time bucket" in m and "delayq_bucket_queues (1)" in m for m in said), said
    assert not any("max_delay" in m for m in said), said  # a long delay takes the ladder as always: no news


def test_a_drained_bucket_deletes_itself_after_its_lease(make_app, collector: Collector, amqp_conn,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         placed: list[tuple[Any, dict[str, Any]]]) -> None:
    monkeypatch.setattr(buckets_module, "LEASE_STEP_S", 1)  # a lease of seconds, not minutes
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_grace=2.0,
                   delayq_bucket_after=0)

    @app.task
    def probe(due: float) -> None:
        collector.add(due=due)

    with running_worker(app):
        probe.apply_async((time.time() + 1,), countdown=1)
        [run] = collector.wait_for(1, timeout=10)
        queue = placed[0][0].routing_key
        deadline = time.monotonic() + 15  # lease <= slice + grace + a step: ~4 s after the publish
        while True:
            try:
                queue_depth(amqp_conn, queue)
            except amqp.NotFound:
                break
            assert time.monotonic() < deadline, f"{queue} still exists"
            time.sleep(0.5)
    assert run["at"] >= run["due"]


def test_a_task_waiting_in_a_bucket_is_pending_and_can_be_cancelled(
        make_app, collector: Collector, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_shards=1,
                   delayq_bucket_after=0)

    @app.task
    def job(tag: str) -> None:
        collector.add(tag=tag)

    with running_worker(app):
        due = time.time() + 8  # long enough for pending() over the session's whole index on a loaded host
        doomed = job.apply_async(("doomed",), eta=due)
        kept = job.apply_async(("kept",), eta=due)
        assert {plan.hops for plan, _ in placed} == {1}
        assert len({plan.routing_key for plan, _ in placed}) == 1  # both wait in one bucket
        assert sorted(t.task_id for t in pending(app, task=job.name)) == sorted([doomed.id, kept.id])
        [result] = cancel(app, doomed.id)
        assert result.found is not None and result.found.task_id == doomed.id
        assert [t.task_id for t in pending(app, task=job.name)] == [kept.id]
        collector.wait_for(1, timeout=20)
        time.sleep(1.0)  # the doomed one came due with it: it must not run
    assert [r["tag"] for r in collector.items] == ["kept"]


def test_a_slice_spreads_over_its_shards_and_opens_only_once_work_comes_due_together(
        make_app, collector: Collector, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_shards=3,
                   delayq_bucket_after=2)

    @app.task
    def probe(due: float) -> None:
        collector.add(due=due)

    with running_worker(app):
        due = time.time() + 3
        with celery_delayq.batch(app):
            for _ in range(8):
                probe.apply_async((due,), eta=due)
        lonely = due + 1.5
        probe.apply_async((lonely,), eta=lonely)  # another second, alone in it: the ladder
        runs = collector.wait_for(9, timeout=30)
    assert all(r["at"] >= r["due"] for r in runs), runs
    hops = [plan.hops for plan, _ in placed]
    assert min(hops[:2]) > 1  # the first two toward the slice: the ladder
    assert hops[2:8] == [1] * 6 and placed[8][0].hops > 1
    assert len({plan.routing_key for plan, _ in placed[2:8]}) == 3  # round robin over the three shards
    assert len(_buckets(app).alive) == 3


def test_a_refused_bucket_declare_sends_the_message_through_the_ladder(
        make_app, collector: Collector, amqp_conn, caplog, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_width=2.0,
                   delayq_bucket_shards=1, delayq_bucket_after=0)

    @app.task
    def probe(due: float) -> None:
        collector.add(due=due)

    due = time.time() + 1.5
    bucket = bucket_for(due, time.time(), width_s=2.0, max_delay_s=600, grace_s=900)
    assert bucket is not None
    spec = celery_delayq.ladder_for(app).config.spec
    dest = Topology(spec, "quorum").destination("", app.conf.task_default_queue)
    squatter = bucket_queue_name(spec, dest, bucket, 0)
    amqp_conn.channel().queue_declare(squatter, durable=True, auto_delete=False)  # same name, other arguments
    try:
        with caplog.at_level("INFO", logger="celery_delayq.rabbitmq.fixed"), running_worker(app):
            probe.apply_async((due,), eta=due)
            [run] = collector.wait_for(1, timeout=20)
    finally:
        amqp_conn.channel().queue_delete(squatter)
    assert run["at"] >= run["due"]
    [(plan, _)] = placed
    assert plan.hops > 1 and not plan.routing_key.startswith(bucket_queue_prefix(spec.prefix))
    said = [r.getMessage() for r in caplog.records]
    assert any("not a due-time bucket: not declared" in m and "PRECONDITION" in m.upper() for m in said), said


def test_by_default_a_second_one_process_fills_with_over_100_long_delays_takes_buckets(
        make_app, amqp_conn, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    """The default (``delayq_backend`` unset): the ladder, until one due second of one destination has had
    ``delayq_bucket_after`` (100) tasks from this process, each at least ``delayq_bucket_min_delay`` (30 s)
    ahead; the rest of that second takes one hop. Shorter delays toward one due time (each a different delay by
    the time it is sent) keep the ladder."""
    app = make_app(delayq_enabled=True)
    config = celery_delayq.ladder_for(app).config
    assert (config.backend, config.bucket_after, config.bucket_min_delay) == ("buckets", 100, 30.0)

    @app.task
    def probe(i: int) -> None: ...

    _not_near_a_window_end()
    short, long = time.time() + 5, time.time() + 31
    with celery_delayq.batch(app):
        for i in range(104):
            probe.apply_async((i,), eta=short)
        for i in range(104):
            probe.apply_async((i,), eta=long)
    hops = [plan.hops for plan, _ in placed]
    assert len(hops) == 208 and min(hops[104:204]) > 1 and hops[204:] == [1, 1, 1, 1], hops[200:]
    # A short delay takes a queue of its own only once the same delay (to the unit) came more than 100 times.
    assert [h == 1 for h in hops[:104]] == [n > 100 for n in _running_counts(placed[:104])]
    got = drain(amqp_conn, app.conf.task_default_queue, 208, timeout=90,
                key=lambda m: m.headers["id"])  # type: ignore[index]
    assert {m.headers["id"] for m in got} >= {h["id"] for _, h in placed}  # type: ignore[index]
    early = [m for m in got if m.arrived < datetime.fromisoformat(m.headers["eta"]).timestamp()]  # type: ignore
    assert not early


def _not_near_a_window_end() -> None:
    """Wait out the end of a recurring delay's counting window if it is near (counts start afresh there)."""
    left = RECURRING_WINDOW_S - time.time() % RECURRING_WINDOW_S
    if left < 15:
        time.sleep(left + 0.1)


def _running_counts(placed: list[tuple[Any, dict[str, Any]]]) -> list[int]:
    """For each placed message: how many sent so far (itself included) had its delay, to the ladder's unit."""
    seen: dict[int, int] = {}
    out = []
    for plan, _ in placed:
        seen[plan.units] = seen.get(plan.units, 0) + 1
        out.append(seen[plan.units])
    return out


def test_by_default_a_countdown_one_process_repeats_over_100_times_takes_a_queue_of_its_own(
        make_app, collector: Collector, amqp_conn, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    """A fixed ``countdown`` (or a retry's backoff step) repeated: after ``delayq_recurring_after`` (100) sends
    of the same delay (to the ladder's 10 ms unit), the rest take one hop through a queue of that delay, with
    the ladder's precision; a delay repeated less often keeps the ladder."""
    app = make_app(delayq_enabled=True)
    assert celery_delayq.ladder_for(app).config.recurring_after == 100

    @app.task(bind=True)
    def probe(self: Any, due: float) -> None:
        collector.add(due=due, eta=datetime.fromisoformat(str(self.request.eta)).timestamp())

    with running_worker(app):
        _not_near_a_window_end()
        with celery_delayq.batch(app):
            for _ in range(130):
                probe.apply_async((time.time() + 1.5,), countdown=1.5)
            for _ in range(20):
                probe.apply_async((time.time() + 2.5,), countdown=2.5)
        runs = collector.wait_for(150, timeout=60)
    counts = _running_counts(placed)
    hops = [plan.hops for plan, _ in placed]
    assert [h == 1 for h in hops] == [n > 100 for n in counts]
    assert hops.count(1) >= 20 and min(hops[130:]) > 1  # most of the 1.5 s ones after 100; none of the 20
    recurring = {plan.routing_key for plan, _ in placed if plan.hops == 1}
    assert all(".1500ms." in name and name.startswith(bucket_queue_prefix(celery_delayq.ladder_for(app).config.prefix))
               for name in recurring), recurring
    assert len(recurring) <= (SHARDS_4X if broker_version(amqp_conn) >= (4, 0) else SHARDS_3X)
    assert all(r["at"] >= r["eta"] for r in runs), [r for r in runs if r["at"] < r["eta"]]  # never early
    late = sorted(r["at"] - r["eta"] for r in runs)
    assert late[-1] < LATE_S + 1.0, late[-10:]


def test_a_long_countdown_one_process_repeats_takes_one_queue_per_window_not_a_bucket_set_per_second(
        make_app, amqp_conn, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    """Steady traffic with one countdown at or over delayq_bucket_min_delay (here 2 s, to keep the test short):
    after delayq_recurring_after sends of that delay, its window's queue (one per shard, however many due
    seconds it spans), one hop, never early; the sends before it counted, and a spread of delays (a burst toward
    one moment) keeps its due-time buckets."""
    app = make_app(delayq_enabled=True, delayq_bucket_min_delay=2, delayq_bucket_max_delay=20,
                   delayq_recurring_after=20, delayq_bucket_after=5, delayq_bucket_shards=2)

    @app.task
    def probe(i: int) -> None: ...

    _not_near_a_window_end()
    with celery_delayq.batch(app):
        for i in range(60):  # one countdown over ~3 due seconds
            probe.apply_async((i,), countdown=3.0)
            time.sleep(0.05)
        moment = time.time() + 6.0
        for i in range(20):  # toward one moment: a new delay each time
            probe.apply_async((i,), eta=moment)
            time.sleep(0.02)
    steady, burst = placed[:60], placed[60:]
    counts = _running_counts(steady)
    recurring = [plan for (plan, _), n in zip(steady, counts) if n > 20]
    # The delay as the ladder rounds it: 3.00 s, or 2.99 s when over 10 ms passed between the check and the publish.
    delays = {int(re.search(r"\.(\d+)ms\.", plan.routing_key).group(1)) for plan in recurring}  # type: ignore[union-attr]
    assert recurring and all(plan.hops == 1 for plan in recurring) and delays <= {2990, 3000}, delays
    assert len({plan.routing_key for plan in recurring}) <= 2 * len(delays)  # its shards, not a set per due second
    assert ".1520s." in recurring[0].routing_key  # the lease: window 600 + bound 20 + grace 900
    assert [plan.hops for plan, _ in burst][5:] == [1] * 15 and not any("ms." in p.routing_key for p, _ in burst)
    got = drain(amqp_conn, app.conf.task_default_queue, len(placed), timeout=60,
                key=lambda m: m.headers["id"])  # type: ignore[index]
    assert len(got) == len(placed) == 80
    assert not [m for m in got if m.arrived < datetime.fromisoformat(m.headers["eta"]).timestamp()]  # type: ignore


def test_only_a_few_recurring_delays_get_queues_the_rest_keep_the_ladder(
        make_app, amqp_conn, caplog, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    """An app's few repeated delays get queues; a spread of delays that each happen to repeat does not turn
    into a queue per value (at most ``RECURRING_DELAYS`` per process and window, the rest logged once)."""
    app = make_app(delayq_enabled=True, delayq_recurring_after=2, delayq_bucket_shards=1)

    @app.task
    def probe(i: int) -> None: ...

    _not_near_a_window_end()
    delays = [1.0 + k for k in range(RECURRING_DELAYS + 1)]
    with caplog.at_level("INFO", logger="celery_delayq.rabbitmq.fixed"), celery_delayq.batch(app):
        for delay in delays:
            for i in range(4):
                probe.apply_async((i,), countdown=delay)
    by_delay: dict[int, list[int]] = {}
    for plan, _ in placed:
        by_delay.setdefault(round(plan.delay), []).append(plan.hops)
    one_hop = [d for d, hops in sorted(by_delay.items()) if 1 in hops]
    assert len(one_hop) == RECURRING_DELAYS, by_delay  # the first ones to repeat
    assert all(min(hops) > 1 for d, hops in by_delay.items() if d not in one_hop), by_delay
    said = [r.getMessage() for r in caplog.records]
    assert sum(f"more than {RECURRING_DELAYS} recurring delays" in m for m in said) == 1, said
    got = drain(amqp_conn, app.conf.task_default_queue, len(placed), timeout=60,
                key=lambda m: m.headers["id"])  # type: ignore[index]
    assert len(got) == len(placed) == 4 * len(delays)
    assert not [m for m in got if m.arrived < datetime.fromisoformat(m.headers["eta"]).timestamp()]  # type: ignore


def test_a_slice_keeps_its_queues_when_its_publishes_cross_a_lease_step(
        make_app, amqp_conn, placed: list[tuple[Any, dict[str, Any]]]) -> None:
    """Publishes toward one second that go on across a lease step (a million published over three minutes)
    keep the queues the slice opened with: any queue of that name lives until the slice end plus the grace,
    so a second set would only double the queues (and, at delayq_bucket_queues, send the rest to the ladder)."""
    app = make_app(delayq_enabled=True, delayq_backend="buckets", delayq_bucket_min_delay=0, delayq_bucket_after=0,
                   delayq_bucket_shards=2)

    @app.task
    def probe(i: int) -> None: ...

    probe.apply_async((0,), countdown=1)  # connects the backend (and opens that second's queues)
    backend = _buckets(app)
    dest = backend.ladder_topology().destination("", app.conf.task_default_queue)
    now = time.time()
    first = bucket_for(now + 400, now, width_s=1.0, max_delay_s=600, grace_s=900)
    later = bucket_for(now + 400, now + 101, width_s=1.0, max_delay_s=600, grace_s=900)  # S - now: 299 s
    assert first is not None and later is not None and later.lease_ms < first.lease_ms  # a lease step apart
    before = len(backend.alive)
    a = backend._bucket(dest, first, 0, now)
    b = backend._bucket(dest, later, 1, now + 101)
    assert a is not None and b is not None
    assert f".{first.lease_ms // 1000}s." in b and len(backend.alive) == before + 2  # the slice's two shards, once
    for name in (a, b):
        assert amqp_conn.channel().queue_declare(name, passive=True).message_count == 0
    drain(amqp_conn, app.conf.task_default_queue, 1, timeout=30)
