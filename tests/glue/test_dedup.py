"""The duplicate-delivery guard on the real Redis, and with a real worker on the real broker."""

from __future__ import annotations

import os
import uuid

import pytest

from celery_delayq import DelayedRetryTask
from celery_delayq.glue.dedup import DuplicateGuard, delivery_key, guard_for
from helpers import running_worker
from retry_helpers import (  # noqa: F401  (fixtures)
    REDIS_URL, parked_fixture, parking_name_fixture, record_run, redis_up, retry_app_fixture,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def guard():
    if not redis_up():
        if os.environ.get("CI"):
            pytest.fail(f"Redis is not reachable at {REDIS_URL}")
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")
    return DuplicateGuard(REDIS_URL, ttl=60, namespace=f"delayq:test{uuid.uuid4().hex[:8]}")


def test_a_copy_is_skipped_but_a_redelivery_of_an_unfinished_run_is_not(guard: DuplicateGuard) -> None:
    key = f"{uuid.uuid4()}:2:"
    assert guard.begin(key)
    assert not guard.begin(key)  # a second copy while the first runs
    assert guard.begin(key, redelivered=True)  # the same message again: its consumer died mid-run
    guard.finish(key)
    assert not guard.begin(key)
    assert not guard.begin(key, redelivered=True)  # finished; only the ack was lost
    assert guard.client.pttl(guard.key(key)) > 50_000  # remembered for the TTL, then forgotten


def test_attempts_and_replays_are_different_deliveries(guard: DuplicateGuard) -> None:
    class Req(dict):
        def __getattr__(self, name):
            return self[name]

    base = {"id": "t1", "retries": 0}
    keys = {delivery_key(Req(base)), delivery_key(Req(base, retries=1)),
            delivery_key(Req(base, **{"x-delayq-replay": "p1"}))}
    assert len(keys) == 3
    assert all(guard.begin(k) for k in keys)


def test_one_guard_per_process_and_a_forked_child_gets_its_own_client(guard: DuplicateGuard) -> None:
    shared = guard_for(REDIS_URL, ttl=60, namespace=guard.namespace)
    assert guard_for(REDIS_URL, ttl=60, namespace=guard.namespace) is shared
    parent_client = shared.client
    key = f"{uuid.uuid4()}:0:"
    assert shared.begin(key)
    pid = os.fork()
    if pid == 0:  # the child: a fresh client, and the parent's claim is seen
        ok = shared._client is None and not shared.begin(key) and shared.client is not parent_client
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert shared.client is parent_client


def test_an_unreachable_redis_fails_open() -> None:
    down = DuplicateGuard("redis://127.0.0.1:1/0", ttl=60)
    assert down.begin("k") and down.begin("k")  # runs rather than risk running zero times


@pytest.mark.parametrize("on", [True, False], ids=["guard-on", "guard-off"])
def test_a_duplicate_delivery_runs_zero_times_only_with_the_guard(retry_app, collector, guard, on: bool) -> None:
    app = retry_app(delayq_dedup=on, delayq_dedup_url=REDIS_URL)

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True)
    def pay(self, amount):
        record_run(collector, self, amount=amount)
        return amount

    task_id = str(uuid.uuid4())
    with running_worker(app):
        for _ in range(2):  # the same message twice, as an at-least-once dead-lettering can deliver it
            pay.apply_async((10,), task_id=task_id)
        pay.apply_async((10,), task_id=task_id, headers={"x-delayq-replay": "p1"})  # a replay is not a copy
        collector.wait_for(2)
        marker = pay.apply_async((0,))  # FIFO on one solo worker: when this ran, the copies were handled
        marker.get(timeout=10)
    runs = [r for r in collector.items if r["id"] == task_id]
    assert len(runs) == (2 if on else 3)
    assert sorted(str(r["replay"]) for r in runs) == (["None", "p1"] if on else ["None", "None", "p1"])
