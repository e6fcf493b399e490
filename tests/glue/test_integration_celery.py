"""Celery end to end: every publish path that carries a delay waits in the ladder, with a real worker."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import celery
import pytest
from celery import chain, group
from kombu import Exchange, Queue

import celery_delayq
from celery_delayq import DelayedRetryTask
from celery_delayq.ladder import headers as H
from celery_delayq.errors import DelayTooLong, InvalidDelay
from helpers import Collector, queue_depth, running_worker


def _lateness(run: dict) -> float:
    return run["at"] - run["due"]


def test_countdown_and_eta_wait_in_the_ladder_never_early(make_app, collector: Collector) -> None:
    app = make_app()

    @app.task(base=DelayedRetryTask, bind=True)
    def probe(self, due: float) -> None:
        collector.add(due=due, headers=dict(self.request.headers or {}), eta=self.request.eta,
                      delivery=self.request.delivery_info or {})

    with running_worker(app):
        now = time.time()
        for cd in (0.05, 0.5, 1.9, 1, 2.5):
            probe.apply_async((time.time() + cd,), countdown=cd)
        eta = datetime.now(timezone.utc) + timedelta(seconds=1.2)
        probe.apply_async((eta.timestamp(),), eta=eta)
        runs = collector.wait_for(6, timeout=20)
    for run in runs:
        assert _lateness(run) >= 0, f"ran {-_lateness(run):.4f} s early"
        assert _lateness(run) < 5.0  # sanity only; lateness is measured in benchmarks/
        if celery.VERSION >= (5, 4):  # Celery 5.3 does not put eta in the task context at all
            assert run["eta"] is not None  # Celery's request.eta is kept
    assert time.time() - now < 10


def test_zero_negative_and_past_eta_run_now(make_app, collector: Collector) -> None:
    app = make_app()

    @app.task(base=DelayedRetryTask)
    def now_task(tag: str) -> None:
        collector.add(tag=tag)

    with running_worker(app):
        start = time.time()
        now_task.apply_async(("zero",), countdown=0)
        now_task.apply_async(("negative",), countdown=-5)
        now_task.apply_async(("past",), eta=datetime.now(timezone.utc) - timedelta(hours=1))
        runs = collector.wait_for(3, timeout=10)
    assert {r["tag"] for r in runs} == {"zero", "negative", "past"}
    assert max(r["at"] for r in runs) - start < 1.0


def test_bad_delays_fail_at_publish_with_specific_errors(make_app) -> None:
    app = make_app()

    @app.task(base=DelayedRetryTask)
    def t() -> None: ...

    with pytest.raises(InvalidDelay):
        t.apply_async(countdown=float("nan"))
    with pytest.raises(InvalidDelay):
        t.apply_async(countdown=float("inf"))
    with pytest.raises(DelayTooLong, match="never truncates"):
        t.apply_async(countdown=10**12)


def test_worker_holds_nothing_while_tasks_wait(make_app, amqp_conn, collector: Collector) -> None:
    app = make_app()

    @app.task(base=DelayedRetryTask)
    def later() -> None:
        collector.add()

    n = 500
    with running_worker(app) as worker:
        with celery_delayq.batch(app):
            for i in range(n):
                later.apply_async(countdown=3600 + i)  # an hour and more: past consumer_timeout
        from celery.worker import state

        consumer = worker.consumer
        assert len(state.reserved_requests) == 0
        assert len(consumer.timer.queue) < 5  # no ETA entries scheduled in the worker
        spec = celery_delayq.ladder_for(app).config.spec
        held = sum(queue_depth(amqp_conn, name) for _k, _d, name, _s in spec.level_queues())
        assert held >= n  # everything waits in the broker
        assert queue_depth(amqp_conn, app.conf.task_default_queue) == 0
    assert len(collector) == 0
    # leave the shared ladder clean for other tests
    ch = amqp_conn.channel()
    for _k, _d, name, _s in spec.level_queues():
        ch.queue_purge(name)


def test_send_task_signature_canvas_with_app_wide_switch(make_app, collector: Collector) -> None:
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app)

    @app.task(bind=True)  # a plain task: the app-wide switch covers it
    def plain(self, tag: str, due: float) -> None:
        collector.add(tag=tag, due=due, entry=(self.request.headers or {}).get(H.ENTRY)
                      or getattr(self.request, H.ENTRY.replace("-", "_"), None))

    with running_worker(app):
        t = time.time
        app.send_task(plain.name, ("send_task", t() + 0.6), countdown=0.6)
        plain.s("signature", t() + 0.7).apply_async(countdown=0.7)
        group(plain.s("group", t() + 0.8), plain.s("group", t() + 0.8)).apply_async(countdown=0.8)
        chain(plain.si("chain", t() + 0.9), plain.si("chain-next", 0)).apply_async(countdown=0.9)
        runs = collector.wait_for(6, timeout=15)
    for run in runs:
        assert run["at"] >= run["due"], run
    assert sorted(r["tag"] for r in runs) == ["chain", "chain-next", "group", "group", "send_task", "signature"]


def test_undelayed_publishes_are_untouched(make_app, amqp_conn) -> None:
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app)

    @app.task
    def plain() -> None: ...

    plain.delay()
    plain.apply_async(countdown=None)
    ch = amqp_conn.channel()
    msgs = [ch.basic_get(app.conf.task_default_queue, no_ack=True) for _ in range(2)]
    assert all(m is not None for m in msgs)
    assert all(H.ENTRY not in m.headers and "x-death" not in m.headers for m in msgs)


@pytest.mark.parametrize("kind", ["direct", "topic", "fanout"])
def test_delivery_lands_where_an_undelayed_publish_would(make_app, collector: Collector, uid: str, kind: str) -> None:
    exchange = Exchange(f"ex.{kind}.{uid}", type=kind)
    queues = [Queue(f"q.{kind}.{uid}", exchange, routing_key=f"jobs.{uid}")]
    if kind != "direct":
        queues.append(Queue(f"q2.{kind}.{uid}", exchange, routing_key="jobs.#" if kind == "topic" else ""))
    app = make_app(task_queues=queues, task_default_queue=queues[0].name,
                   task_routes={"*": {"queue": queues[0].name}})

    @app.task(base=DelayedRetryTask, bind=True)
    def routed(self, tag: str, due: float) -> None:
        info = self.request.delivery_info or {}
        collector.add(tag=tag, due=due, where=(info.get("exchange"), info.get("routing_key")))

    with running_worker(app):
        routed.apply_async(("now", 0))
        baseline = collector.wait_for(len(queues), timeout=10)
        routed.apply_async(("later", time.time() + 0.4), countdown=0.4)
        runs = collector.wait_for(2 * len(queues), timeout=10)[len(queues):]
    # same exchange, same routing key, same number of copies (fanout/topic reach both queues)
    assert sorted(r["where"] for r in runs) == sorted(b["where"] for b in baseline)
    assert all(r["tag"] == "later" and r["at"] >= r["due"] for r in runs)


needs_quorum_task_queues = pytest.mark.skipif(
    celery.VERSION < (5, 5), reason="quorum queues as task queues need Celery 5.5+ (worker_detect_quorum_queues)")


@needs_quorum_task_queues
def test_quorum_destination_and_explicit_queue_option(make_app, collector: Collector, uid: str) -> None:
    qq = Queue(f"qq.{uid}", Exchange(f"qq.{uid}", type="direct"), routing_key=f"qq.{uid}",
               queue_arguments={"x-queue-type": "quorum"})
    other = Queue(f"other.{uid}")
    app = make_app(task_queues=[qq, other], task_default_queue=qq.name)

    @app.task(base=DelayedRetryTask, bind=True)
    def where(self) -> None:
        collector.add(rk=(self.request.delivery_info or {}).get("routing_key"))

    try:
        with running_worker(app):
            where.apply_async(countdown=0.3)
            where.apply_async(countdown=0.3, queue=other.name)
            runs = collector.wait_for(2, timeout=10)
        assert sorted(r["rk"] for r in runs) == sorted([qq.routing_key, other.name])
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(qq.name)


@needs_quorum_task_queues
def test_with_celery_native_delayed_delivery_active_each_task_passes_one_ladder_once(
        make_app, collector: Collector, uid: str, amqp_conn) -> None:
    # quorum queue + topic exchange: Celery 5.5+ rewrites delayed publishes to celery_delayed_27
    ex = Exchange(f"native.{uid}", type="topic")
    qq = Queue(f"nq.{uid}", ex, routing_key=f"native.{uid}", queue_arguments={"x-queue-type": "quorum"})
    app = make_app(task_queues=[qq], task_default_queue=qq.name, delayq_enabled=True,
                   task_default_exchange=ex.name, task_default_exchange_type="topic",
                   task_default_routing_key=qq.routing_key)
    celery_delayq.install(app)

    @app.task(bind=True)
    def native(self, due: float) -> None:
        collector.add(due=due, hops=(self.request.headers or {}).get(H.HOPS),
                      rk=(self.request.delivery_info or {}).get("routing_key"))

    try:
        with running_worker(app):
            native.apply_async((time.time() + 1.3,), countdown=1.3)
            runs = collector.wait_for(1, timeout=10)
            time.sleep(1.5)  # a second copy (from a second ladder) would arrive by now
        assert len(collector) == 1
        assert runs[0]["at"] >= runs[0]["due"]
        assert runs[0]["rk"] == qq.routing_key  # not the 28-bit native key
        ch = amqp_conn.channel()
        for level in range(28):  # nothing went into Celery's own ladder
            try:
                assert ch.queue_declare(f"celery_delayed_{level}", passive=True).message_count == 0
            except Exception:
                ch = amqp_conn.channel()
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(qq.name)


def test_thirty_consecutive_retries_keep_routing_key_and_headers(make_app, collector: Collector) -> None:
    app = make_app()

    @app.task(base=DelayedRetryTask, bind=True, max_retries=None)
    def flaky(self) -> None:
        collector.add(retries=self.request.retries, rk=(self.request.delivery_info or {}).get("routing_key"),
                      custom=(self.request.headers or {}).get("custom"),
                      priority=(self.request.delivery_info or {}).get("priority"), eta=self.request.eta)
        if self.request.retries < 30:
            raise self.retry(countdown=0.02)

    with running_worker(app):
        flaky.apply_async(headers={"custom": "kept"}, priority=3)
        runs = collector.wait_for(31, timeout=60)
    assert [r["retries"] for r in runs] == list(range(31))
    assert {r["rk"] for r in runs} == {app.conf.task_default_queue}  # the key never grows
    assert all(r["custom"] == "kept" for r in runs[1:]) or all(r["custom"] is None for r in runs[1:])
    if celery.VERSION >= (5, 4):
        assert all(r["eta"] is not None for r in runs[1:])  # every retry came through the ladder


def test_autoretry_with_backoff_waits_in_ladder(make_app, collector: Collector) -> None:
    app = make_app()

    @app.task(base=DelayedRetryTask, bind=True, autoretry_for=(ConnectionError,), retry_backoff=True,
              retry_jitter=False, max_retries=3)
    def charge(self) -> None:
        collector.add(retries=self.request.retries)
        raise ConnectionError("card processor down")

    with running_worker(app):
        charge.delay()
        runs = collector.wait_for(4, timeout=20)
    from celery.utils.time import get_exponential_backoff_interval

    gaps = [b["at"] - a["at"] for a, b in zip(runs, runs[1:])]
    expected = [get_exponential_backoff_interval(1, i, 600, full_jitter=False) for i in range(3)]
    for gap, want in zip(gaps, expected):
        assert gap >= want, (gaps, expected)
        assert gap < want + 3.0, (gaps, expected)  # sanity only


def test_worker_declares_the_ladder_when_it_starts(make_app, amqp_conn, uid: str) -> None:
    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.rabbitmq.topology import Topology

    prefix = f"ws{uid}"
    app = make_app(delayq_prefix=prefix, delayq_levels=6)

    @app.task(base=DelayedRetryTask)
    def idle() -> None: ...

    topo = Topology(LadderSpec(prefix=prefix, levels=6), "quorum")
    try:
        with running_worker(app):
            topo.verify(amqp_conn)  # exists before any delayed publish, with the right arguments
    finally:
        topo.delete(amqp_conn, if_empty=False)
