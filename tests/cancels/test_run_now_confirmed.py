"""A run-now's new copy is confirmed by the broker before the waiting copy is cancelled (real broker, worker).

The chaos soak (``benchmarks/faults/soak.py``) lost two tasks this way during a partition: the new copy
went out unconfirmed and was dropped, while the cancel of the old copy was confirmed. Here the broker
refuses the copy outright (a ``max-length 0``, ``reject-publish`` policy on the destination queue):
``reschedule(..., due=None)`` must raise naming the task and change nothing, so the task still waits and
runs once, on time.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from typing import Any, Iterator

import pytest

from celery_delayq import PublishError, pending
from celery_delayq.cancels.reschedule import reschedule
from helpers import Collector, running_worker

@contextlib.contextmanager
def refusing(vhost: str, queue: str, uid: str) -> Iterator[None]:
    """The broker refuses every publish to ``queue`` meanwhile (a ``max-length 0``, ``reject-publish`` policy)."""
    policy = f"full{uid}"
    subprocess.run(["rabbitmqctl", "set_policy", "-p", vhost, "--apply-to", "queues", "--priority", "900", policy,
                    f"^{queue.replace('.', '[.]')}$", json.dumps({"max-length": 0, "overflow": "reject-publish"})],
                   check=True, capture_output=True, timeout=60)
    try:
        time.sleep(1.0)  # policies apply asynchronously
        yield
    finally:
        subprocess.run(["rabbitmqctl", "clear_policy", "-p", vhost, policy], capture_output=True, timeout=60)


#: Seconds the tasks wait: long enough that a loaded machine still finds them waiting when it acts.
DUE_IN = 20.0


def test_a_run_now_the_broker_refuses_changes_nothing(make_app, collector: Collector, vhost: str, uid: str) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.job")
    def job(tag: str) -> None:
        collector.add(tag=tag, at=time.time())

    queue = app.conf.task_default_queue
    due = time.time() + DUE_IN
    waiting = job.apply_async(("waiting",), countdown=DUE_IN)
    deadline = time.time() + DUE_IN - 5
    while not pending(app, task_id=waiting.id) and time.time() < deadline:
        time.sleep(0.2)
    with refusing(vhost, queue, uid):
        with pytest.raises(PublishError, match=f"{waiting.id}.*not confirmed.*still waits") as refused:
            reschedule(app, waiting.id, due=None)
        assert refused.value.failed == [waiting.id]
    assert [t.task_id for t in pending(app, task_id=waiting.id)] == [waiting.id]  # not cancelled, not moved
    with running_worker(app):
        collector.wait_for(1, timeout=30)
        time.sleep(1.0)
    runs: list[dict[str, Any]] = collector.items
    assert [r["tag"] for r in runs] == ["waiting"] and runs[0]["at"] >= due


def test_a_bulk_run_now_stops_at_the_copy_the_broker_refuses(make_app, collector: Collector, vhost: str,
                                                            uid: str) -> None:
    """The tasks before the refused one moved (their old passes cancelled), it and the ones after it still wait."""
    from celery_delayq.cancels.reschedule import reschedule_many

    app = make_app(delayq_enabled=True)
    full = f"{app.conf.task_default_queue}.full"

    @app.task(name=f"{app.main}.job")
    def job(tag: str) -> None:
        collector.add(tag=tag, at=time.time())

    due = time.time() + DUE_IN  # no copy is due before this
    first = job.apply_async(("first",), countdown=DUE_IN)
    refused = job.apply_async(("refused",), countdown=DUE_IN, queue=full)
    last = job.apply_async(("last",), countdown=DUE_IN)
    ids = [first.id, refused.id, last.id]
    deadline = time.time() + DUE_IN - 5
    while len(waiting := {t.task_id: t for t in pending(app, task=f"{app.main}.*")}) < 3 and time.time() < deadline:
        time.sleep(0.2)
    with refusing(vhost, full, uid):
        with pytest.raises(PublishError, match=f"{refused.id}.*not confirmed.*still waits") as stopped:
            reschedule_many(app, [waiting[i] for i in ids], due=None)
        assert stopped.value.failed == [refused.id]
    assert {t.task_id for t in pending(app, task=f"{app.main}.*")} == {refused.id, last.id}
    with running_worker(app, queues=[app.conf.task_default_queue, full]):
        collector.wait_for(3, timeout=30)
        time.sleep(1.5)
    runs: dict[str, list[float]] = {}
    for r in collector.items:
        runs.setdefault(r["tag"], []).append(r["at"])
    assert sorted(runs) == ["first", "last", "refused"] and all(len(v) == 1 for v in runs.values()), runs
    assert runs["first"][0] < due and runs["refused"][0] >= due and runs["last"][0] >= due
