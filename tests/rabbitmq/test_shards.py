"""Sharded ladders (``delayq_shards``), as users deploy them: a publisher process of its own, a real worker.

The publisher never calls ``install()``: ``delayq_enabled`` and
``delayq_shards`` are all it sets. The test reads the broker: which shard's
queues hold the waiting tasks (by passive declares), what ``delayq status``
says, and when each task reaches its queue and its worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import amqp
import pytest
from celery import Celery

from helpers import delete_ladder, drain, queue_depth, running_worker

pytestmark = pytest.mark.timeout(180)

SHARDS = 2

PROJECT = '''
import os
from celery import Celery
import celery_delayq  # noqa: F401 - the ladder turns on where the package is imported
app = Celery("proj", broker=os.environ["BROKER"], set_as_current=True)
app.conf.update(delayq_enabled=True, delayq_prefix=os.environ["PREFIX"], delayq_shards=int(os.environ["SHARDS"]),
                task_default_queue=os.environ["QUEUE"], broker_heartbeat=0)

@app.task(name="proj.add")
def add(x, y=0):
    return x + y
'''

PUBLISH = '''
import json, sys, time
from proj import add
countdown, n = float(sys.argv[1]), int(sys.argv[2])
sent = time.time()
ids = [add.apply_async((i,), countdown=countdown).id for i in range(n)]
print(json.dumps({"sent": sent, "ids": ids}))
'''


@pytest.fixture
def sharded_project(tmp_path: Path, broker_url: str, uid: str, amqp_conn: amqp.Connection) -> Iterator[dict[str, Any]]:
    """A project whose ladder (a prefix of its own) has two shards; its ladder and queue are deleted after."""
    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.rabbitmq.topology import Topology

    prefix, queue = f"sh{uid}", f"sharded.{uid}"
    amqp_conn.channel().queue_declare(queue, durable=True, auto_delete=False)
    (tmp_path / "proj.py").write_text(PROJECT)
    env = dict(os.environ, BROKER=broker_url, PREFIX=prefix, QUEUE=queue, SHARDS=str(SHARDS),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    spec = LadderSpec(prefix=prefix, shards=SHARDS)
    yield {"env": env, "dir": tmp_path, "queue": queue, "spec": spec, "broker_url": broker_url}
    topo = Topology(spec, "quorum")
    with contextlib.suppress(Exception):
        delete_ladder(amqp_conn, spec, exit_queues=[topo.destination("", queue).exit_queue])
    with contextlib.suppress(Exception):
        amqp_conn.channel().queue_delete(queue)


def _publish(project: dict[str, Any], countdown: float, n: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PUBLISH), str(countdown), str(n)],
                          cwd=project["dir"], env=project["env"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tasks_wait_in_the_shard_their_id_picks_and_arrive_on_time(
        sharded_project: dict[str, Any], amqp_conn: amqp.Connection) -> None:
    spec = sharded_project["spec"]
    # Each task waits first in the top queue of its path (600 s: level 7), in its own shard.
    waiting = _publish(sharded_project, 600, 40)
    expected = Counter(spec.shard_of(i) for i in waiting["ids"])
    assert set(expected) == set(range(SHARDS)), expected  # 40 ids hash to both shards
    units = spec.units_for(600)
    per_shard = {s: queue_depth(amqp_conn, spec.path(units, s)[0]) for s in range(SHARDS)}
    assert per_shard == dict(expected)

    # What the operator sees: every shard's queues, and the waiting total over all of them.
    status = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", "delayq", "status", "--json"],
                            cwd=sharded_project["dir"], env=sharded_project["env"], capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["ladder"]["shards"] == SHARDS and doc["complete"]
    assert doc["totals"]["waiting"] == 40
    shown = {q["queue"]: (q["shard"], q["messages"]) for lv in doc["levels"] for q in lv["queues"]}
    assert len(shown) == SHARDS * spec.levels * (spec.radix - 1)
    assert {shown[spec.path(units, s)[0]] for s in range(SHARDS)} == {(s, n) for s, n in expected.items()}
    table = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", "delayq", "status"],
                           cwd=sharded_project["dir"], env=dict(sharded_project["env"], COLUMNS="120"),
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "2 shards" in table.stdout
    assert "waiting per shard: " + " · ".join(f"s{s} {expected[s]}" for s in range(SHARDS)) in table.stdout

    # Short delays, through both shards, arrive complete and never early.
    soon = _publish(sharded_project, 1.5, 40)
    got = drain(amqp_conn, sharded_project["queue"], 40, timeout=30, key=lambda m: m.headers["id"])
    by_id = {m.headers["id"]: m for m in got}
    assert set(by_id) == set(soon["ids"])
    for m in by_id.values():
        assert "x-delayq-entry" in m.headers
        assert m.arrived >= float(m.headers["x-delayq-due"])  # type: ignore[attr-defined]
        assert float(m.headers["x-delayq-due"]) >= soon["sent"] + 1.5 - 0.05


def test_a_worker_runs_tasks_and_retries_through_a_sharded_ladder(sharded_project: dict[str, Any]) -> None:
    from celery_delayq import DelayedRetryTask
    from celery_delayq.glue.app_ladder import forget_ladder

    app = Celery("shardworker", broker=sharded_project["broker_url"], set_as_current=False)
    app.conf.update(delayq_prefix=sharded_project["env"]["PREFIX"], delayq_shards=SHARDS,
                    task_default_queue=sharded_project["queue"], broker_heartbeat=0)
    runs: dict[int, list[float]] = {}

    @app.task(base=DelayedRetryTask, bind=True, name="proj.add", max_retries=3)
    def add(self: Any, x: int, y: int = 0) -> int:
        runs.setdefault(x, []).append(time.time())
        if len(runs[x]) == 1:
            raise self.retry(countdown=1.0)  # every first run fails once: a retry through the ladder
        return x + y

    try:
        with running_worker(app):
            out = _publish(sharded_project, 1.0, 10)
            deadline = time.time() + 40
            while time.time() < deadline and (len(runs) < 10 or any(len(v) < 2 for v in runs.values())):
                time.sleep(0.2)
    finally:
        forget_ladder(app)
    assert sorted(runs) == list(range(10)), runs
    spec = sharded_project["spec"]
    assert {spec.shard_of(i) for i in out["ids"]} == set(range(SHARDS))
    for x, times in runs.items():
        assert len(times) == 2, (x, times)
        assert times[0] >= out["sent"] + 1.0 - 0.05  # the delayed first run, never early
        assert times[1] - times[0] >= 1.0  # the retry waited its countdown
