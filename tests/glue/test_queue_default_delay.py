"""Per-queue default delays: tasks sent to the queue wait its default unless they carry their own delay."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kombu import Queue

import celery_delayq
from celery_delayq import DelayedRetryTask
from celery_delayq.ladder import headers as H
from celery_delayq.config import DelayqConfig
from celery_delayq.errors import DelayTooLong, InvalidDelay
from celery_delayq.glue.queue_delays import DelayedQueue, default_delay
from helpers import running_worker

pytestmark = pytest.mark.timeout(60)


def record(collector: Any, task: Any, sent: float) -> None:
    collector.add(id=task.request.id, queue=task.request.delivery_info.get("routing_key"),
                  delay=task.request.get(H.DELAY), waited=time.time() - sent)


def test_setting_delays_every_task_sent_to_the_queue_unless_it_has_its_own(make_app, collector, uid) -> None:
    slow, fast = f"slow.{uid}", f"q.{uid}"
    app = make_app(delayq_queue_delays={slow: 0.6}, task_queues=[Queue(fast), Queue(slow)])
    celery_delayq.install(app)

    @app.task(bind=True)  # a plain task: the queue's default applies to every task of the app
    def plain(self, sent):
        record(collector, self, sent)

    @app.task(base=DelayedRetryTask, bind=True)
    def ladder(self, sent):
        record(collector, self, sent)

    with running_worker(app):
        now = time.time()
        default = plain.apply_async((now,), queue=slow)
        own = ladder.apply_async((now,), queue=slow, countdown=0.2)
        own_plain = plain.apply_async((now,), queue=slow, countdown=0.2)  # Celery's own eta handling
        immediate = ladder.apply_async((now,), queue=slow, countdown=0)  # an explicit "now" wins too
        elsewhere = plain.apply_async((now,), queue=fast)
        collector.wait_for(5, timeout=15)
    runs = {r["id"]: r for r in collector.items}
    assert runs[default.id]["delay"] == pytest.approx(0.6, abs=0.05) and runs[default.id]["waited"] >= 0.58
    assert runs[own.id]["delay"] == pytest.approx(0.2, abs=0.05) and runs[own.id]["waited"] < 0.55
    assert runs[own_plain.id]["delay"] is None and 0.18 <= runs[own_plain.id]["waited"] < 0.55
    assert runs[immediate.id]["delay"] is None and runs[immediate.id]["waited"] < 0.5
    assert runs[elsewhere.id]["delay"] is None  # queues without a default: no ladder at all
    assert runs[default.id]["queue"] == slow


def test_delayed_queue_declares_its_default_without_broker_arguments(make_app, collector, uid) -> None:
    slow = DelayedQueue(f"slow2.{uid}", delay=0.4)
    assert slow.queue_arguments is None and slow.delay == 0.4
    app = make_app(task_queues=[Queue(f"q.{uid}"), slow])

    @app.task(base=DelayedRetryTask, bind=True)
    def later(self, sent):
        record(collector, self, sent)

    with running_worker(app):
        later.apply_async((time.time(),), queue=slow.name)
        (run,) = collector.wait_for(1, timeout=10)
    assert run["delay"] == pytest.approx(0.4, abs=0.05) and run["waited"] >= 0.38


def test_apps_without_defaults_never_consult_the_router(make_app, collector, uid, monkeypatch) -> None:
    app = make_app()

    @app.task(base=DelayedRetryTask, bind=True)
    def quick(self, sent):
        record(collector, self, sent)

    router = celery_delayq.install(app)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an undelayed publish looked up a queue default")

    monkeypatch.setattr("celery_delayq.glue.app_ladder.default_delay", fail)
    with running_worker(app):
        quick.delay(time.time())
        (run,) = collector.wait_for(1, timeout=10)
    assert run["delay"] is None
    assert router.queue_delays == {}


def test_bad_queue_delays_fail_when_the_config_is_read() -> None:
    assert DelayqConfig(queue_delays={"b": 2, "a": 1.5}).queue_delays == (("a", 1.5), ("b", 2.0))
    with pytest.raises(InvalidDelay, match=r"delayq_queue_delays\['slow'\]"):
        DelayqConfig(queue_delays={"slow": -1})
    with pytest.raises(DelayTooLong):
        DelayqConfig(levels=4, queue_delays={"slow": 60})
    hash(DelayqConfig(queue_delays={"slow": 3}))  # still usable as the publisher registry's key


def test_default_delay_lookup_by_declared_queue_or_default_exchange_key() -> None:
    delays = {"slow": 5.0}
    assert default_delay(delays, "tasks", "any.key", [Queue("slow")]) == 5.0
    assert default_delay(delays, "", "slow", None) == 5.0
    assert default_delay(delays, "tasks", "slow", None) is None  # a routing key is not a queue name there
    assert default_delay(delays, "", "fast", [Queue("fast")]) is None
