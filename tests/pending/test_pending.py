"""``delayq pending`` / ``celery_delayq.pending``: the index of waiting tasks, on a real broker.

The pure layout first, then
the broker: a refused ladder publish is never listed (and still raises),
the latest pass wins, due tasks are never listed, filters, the fast lookup
by id, tasks scheduled inside ``batch()``, the CLI, and that reading the
index does not disturb the ladder (nothing early, nothing late, no duplicates).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import amqp
import pytest

import celery_delayq
from celery_delayq import DelayedRetryTask, pending
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.index import IndexUnavailable
from celery_delayq.ladder.index_layout import IndexLayout
from celery_delayq.rabbitmq.topology import Topology
from helpers import Collector, running_worker


# -- pure -----------------------------------------------------------------------------
def test_retention_covers_the_longest_delay() -> None:
    spec = LadderSpec()
    layout = IndexLayout(spec)
    assert layout.max_age_s >= spec.max_delay_s + 86400
    args = layout.stream_args(1000)
    assert args["x-queue-type"] == "stream" and args["x-max-age"] == f"{layout.max_age_s}s"
    assert len(layout.shard_queues) == 16 and len(set(layout.shard_queues)) == 16


# -- broker ----------------------------------------------------------------------------------
def test_a_refused_ladder_publish_is_not_listed(make_app, private_ladder, amqp_conn: amqp.Connection) -> None:
    """Only a message the ladder confirmed gets an index entry: a refused one is never listed."""
    from celery_delayq.errors import PublishReturned

    topo: Topology = private_ladder(levels=8)
    app = make_app(delayq_enabled=True, delayq_prefix=topo.spec.prefix, delayq_levels=8)
    uid = app.main

    @app.task(name=f"{uid}.job")
    def job() -> None: ...

    publisher = celery_delayq.install(app).publisher
    publisher.declare()
    spec = publisher.spec
    for b in [b for b in spec.bindings() if b.destination == spec.level_queue(4, 1)]:  # its level and its entry
        amqp_conn.channel().queue_unbind(b.destination, b.source, b.routing_key)  # level 4, digit 1: routes nowhere
    kept = job.apply_async(countdown=30)
    with pytest.raises(PublishReturned):
        job.apply_async(countdown=spec.radix**4 * spec.unit_ms / 1000 + 0.004)  # the mandatory flag still works
    assert [t.task_id for t in pending(app, task=f"{uid}.*")] == [kept.id]


def test_pending_lists_waiting_tasks_with_filters(make_app) -> None:
    app = make_app(delayq_enabled=True)
    uid = app.main

    @app.task(name=f"{uid}.charge")
    def charge(order: int) -> None: ...

    @app.task(name=f"{uid}.remind")
    def remind(order: int) -> None: ...

    now = time.time()
    a = charge.apply_async((1,), countdown=600)
    b = charge.apply_async((2,), countdown=900, queue=f"other.{uid}")
    c = remind.apply_async((3,), countdown=1200)
    soon = remind.apply_async((4,), countdown=0.3)
    time.sleep(0.5)  # `soon` is due: delivered or in its last hop, never listed
    mine = [t for t in pending(app) if t.task_name and t.task_name.startswith(uid)]
    assert [t.task_id for t in mine] == [a.id, b.id, c.id]  # soonest due first
    first = mine[0]
    assert first.task_name == f"{uid}.charge" and first.attempt == 0
    assert first.queue == app.conf.task_default_queue and first.routing_key == app.conf.task_default_queue
    assert abs(first.due - (now + 600)) < 5 and first.due_iso.endswith("Z")
    assert mine[1].queue == f"other.{uid}"
    assert [t.task_id for t in pending(app, task=f"{uid}.ch*")] == [a.id, b.id]
    assert [t.task_id for t in pending(app, queue=f"other.{uid}")] == [b.id]
    assert [t.task_id for t in pending(app, task_id=c.id)] == [c.id]
    assert pending(app, task_id=soon.id) == []
    assert pending(app, task_id=str(uuid.uuid4())) == []
    assert [t.task_id for t in pending(app, task=f"{uid}.*", due_before=now + 1000)] == [a.id, b.id]
    assert [t.task_id for t in pending(app, task=f"{uid}.*", due_after=now + 800)] == [b.id, c.id]
    later = pending(app, task=f"{uid}.*", now=now + 1000)
    assert [t.task_id for t in later] == [c.id]  # judged at another time: only what is still waiting then


def test_latest_pass_wins_across_retries(make_app, collector: Collector) -> None:
    app = make_app()
    uid = app.main

    @app.task(base=DelayedRetryTask, bind=True, name=f"{uid}.flaky", max_retries=3)
    def flaky(self: Any) -> None:
        collector.add(attempt=self.request.retries)
        raise self.retry(countdown=300)

    with running_worker(app):
        result = flaky.apply_async(countdown=0.2)
        collector.wait_for(1, timeout=20)
        deadline = time.time() + 10
        found: list[Any] = []
        while time.time() < deadline:
            found = pending(app, task_id=result.id)
            if found and found[0].attempt == 1:
                break
            time.sleep(0.2)
    assert len(found) == 1 and found[0].attempt == 1, found
    assert found[0].due > time.time() + 250


def test_reading_the_index_does_not_disturb_the_ladder(make_app, collector: Collector) -> None:
    """Readers only look: every task runs once, none early, none held up, while pending() reads on."""
    # A ladder of its own: the session's shared one holds every earlier test's entries (20,000 from
    # the burst test), and a read covers the whole ladder span, so reads there take seconds on 2 cores.
    app = make_app(delayq_enabled=True, delayq_prefix=f"dqp{uuid.uuid4().hex[:6]}")

    @app.task(name=f"{app.main}.probe", bind=True)
    def probe(self: Any, due: float) -> None:
        collector.add(id=self.request.id, due=due)

    n = 60
    with running_worker(app):
        ids = set()
        for i in range(n):
            delay = 1.0 + (i % 30) / 10
            ids.add(probe.apply_async((time.time() + delay,), countdown=delay).id)
        reads = 0
        deadline = time.time() + 6
        while time.time() < deadline:
            pending(app, task=f"{app.main}.*")
            reads += 1
        runs = collector.wait_for(n, timeout=30)
        time.sleep(1.0)  # a duplicate would arrive within this
        runs = list(collector.items)
    assert reads >= 3
    assert sorted(r["id"] for r in runs) == sorted(ids), "a task ran twice or not at all"
    lateness = [r["at"] - r["due"] for r in runs]
    assert min(lateness) >= 0, f"ran {-min(lateness):.3f} s early"
    assert max(lateness) < 2.0, f"ran {max(lateness):.3f} s late"
    assert pending(app, task=f"{app.main}.*") == []


def test_index_off_says_so(make_app) -> None:
    app = make_app(delayq_enabled=True, delayq_index=False)
    with pytest.raises(IndexUnavailable, match="delayq_index"):
        pending(app)


def _cli(app_module: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "celery", "-A", app_module.stem, "delayq", *args],
                          cwd=app_module.parent, capture_output=True, text=True, timeout=120, env=env)


CLI_APP = '''
from celery import Celery
app = Celery("{name}", broker="{url}")
app.conf.update(task_default_queue="{queue}", delayq_prefix="{prefix}", delayq_enabled=True, broker_heartbeat=0)

@app.task(name="{name}.later")
def later(x):
    return x
'''


def test_cli_pending_json_table_and_filters(make_app, broker_url: str, prefix: str, tmp_path: Path) -> None:
    name = f"cli{uuid.uuid4().hex[:6]}"
    module = tmp_path / f"{name}.py"
    module.write_text(CLI_APP.format(name=name, url=broker_url, queue=f"q.{name}", prefix=prefix))
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{name}.later")
    def later(x: int) -> int:
        return x

    celery_delayq.install(app).publisher.declare()
    empty = _cli(module, "pending", "--task", f"{name}.*", "--json")
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == []
    r1 = later.apply_async((1,), countdown=3600)
    r2 = later.apply_async((2,), countdown=7200)
    out = _cli(module, "pending", "--task", f"{name}.*", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [d["task_id"] for d in doc] == [r1.id, r2.id]
    assert set(doc[0]) == {"task_id", "task", "exchange", "routing_key", "queue", "due", "attempt",
                           "args", "kwargs", "last_error"}
    assert doc[0]["task"] == f"{name}.later" and doc[0]["attempt"] == 0 and doc[0]["due"].endswith("Z")
    by_id = _cli(module, "pending", "--id", r2.id, "--json")
    assert [d["task_id"] for d in json.loads(by_id.stdout)] == [r2.id]
    before = _cli(module, "pending", "--task", f"{name}.*", "--due-before", "90m", "--json")
    assert [d["task_id"] for d in json.loads(before.stdout)] == [r1.id]
    table = _cli(module, "pending", "--task", f"{name}.*")
    assert table.returncode == 0 and r1.id in table.stdout and "2 waiting" in table.stdout
    bad = _cli(module, "pending", "--due-after", "tomorrow")
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr


def test_tasks_scheduled_in_batch_are_listed(make_app) -> None:
    """Inside batch() the publisher writes the entries (500 a message) once the block's confirms are in."""
    app = make_app(delayq_enabled=True)
    uid = app.main

    @app.task(name=f"{uid}.bulk")
    def bulk(i: int) -> None: ...

    with celery_delayq.batch(app):
        ids = [bulk.apply_async((i,), countdown=900 + i).id for i in range(1200)]  # > one chunk per shard
    single = bulk.apply_async((-1,), countdown=950).id
    found = pending(app, task=f"{uid}.bulk")
    assert sorted(t.task_id for t in found) == sorted(ids + [single])
    assert all(t.queue == app.conf.task_default_queue and t.attempt == 0 for t in found)
    assert [t.task_id for t in pending(app, task_id=ids[700])] == [ids[700]]
    assert abs(pending(app, task_id=ids[5])[0].due - found[0].due - 5) < 1.0


_PUBLISHER = '''
import sys, time
from celery import Celery
import celery_delayq
broker, prefix, queue, linger = sys.argv[1:5]
app = Celery("pubproc", broker=broker, set_as_current=False)
app.conf.update(delayq_enabled=True, delayq_prefix=prefix, task_default_queue=queue, broker_heartbeat=0)
result = app.send_task("pubproc.job", countdown=600)
print(result.id, time.time(), flush=True)
time.sleep(float(linger))  # a web process lives on; a script exits at once
'''


@pytest.mark.parametrize("linger", [20.0, 0.0], ids=["long-lived-process", "exiting-process"])
def test_another_process_sees_a_publish_within_a_second(broker_url: str, prefix: str, uid: str, make_app,
                                                        linger: float) -> None:
    """Entries are buffered after the confirm and written within 0.25 s, or at exit."""
    app = make_app(delayq_enabled=True)
    child = subprocess.Popen([sys.executable, "-c", _PUBLISHER, broker_url, prefix, f"q.{uid}", str(linger)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        task_id, published = child.stdout.readline().split()
        if not linger:
            assert child.wait(timeout=30) == 0
        found: list[Any] = []
        while time.time() < float(published) + 10:
            found = pending(app, task_id=task_id)
            if found:
                break
            time.sleep(0.05)
        seen_after = time.time() - float(published)
        assert [t.task_id for t in found] == [task_id]
        if linger:
            assert child.poll() is None  # still running: the buffer was written by its timer
            assert seen_after < 1.5, f"listed {seen_after:.2f} s after apply_async returned"
    finally:
        child.kill()
        child.wait()
