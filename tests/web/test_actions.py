"""Run now, reschedule and cancel through the web API, on a real broker with a real worker.

The task must run exactly once, at the new time, keeping its id; the copy
left in the ladder is dropped by its pass, not by its id.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from celery_delayq import cancel, pending
from celery_delayq.index import TaskIdNotFound
from helpers import Collector, running_worker

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from celery_delayq.web import create_app  # noqa: E402


def _csrf(client: TestClient) -> dict[str, str]:
    client.get("/parked")  # any page sets the cookie; this one does not read the session's whole index
    return {"X-CSRF-Token": client.cookies["delayq_csrf"]}


def test_run_now_runs_once_with_the_same_id(make_app, collector: Collector, tmp_path: Any) -> None:
    app = make_app(delayq_enabled=True, delayq_telemetry_dir=str(tmp_path))

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str, n: int = 0) -> None:
        collector.add(tag=tag, n=n, id=self.request.id, at=time.time())

    with running_worker(app):
        late_due = time.time() + 12
        late = job.apply_async(("late",), {"n": 7}, countdown=12)
        client = TestClient(create_app(app))
        headers = _csrf(client)
        started = time.time()
        r = client.post(f"/api/waiting/{late.id}/run-now", headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["run_now"] is True
        collector.wait_for(1, timeout=10)
        assert collector.items[0]["at"] - started < 3  # now, not at its old due time
        assert [t.task_id for t in pending(app, task=f"{app.main}.*")] == []  # the old pass is not listed
        # A cancel now agrees with the list: the task is not waiting (it ran), so nothing is cancelled.
        with pytest.raises(TaskIdNotFound, match="was run now or moved") as refused:
            cancel(app, late.id)
        assert refused.value.moved == [late.id]
        assert client.post(f"/api/waiting/{late.id}/cancel", headers=headers).status_code == 404
        time.sleep(max(0.0, late_due + 1.5 - time.time()))  # past the old copy's due time: it arrives, is dropped
    assert [(i["tag"], i["n"], i["id"]) for i in collector.items] == [("late", 7, late.id)]
    from celery_delayq.telemetry import flush_all

    flush_all()
    events = [json.loads(line) for f in tmp_path.rglob("*.jsonl") for line in f.read_text().splitlines()]
    dropped = [e for e in events if e.get("event") == "cancelled" and e.get("task_id") == late.id]
    assert [e["reason"] for e in dropped] == ["superseded"]  # the worker recorded the copy it dropped


def test_reschedule_moves_the_task_and_it_runs_once(make_app, collector: Collector) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag, id=self.request.id, at=time.time())

    with running_worker(app):
        old_due = time.time() + 8
        soon = job.apply_async(("moved",), countdown=8)
        client = TestClient(create_app(app))
        headers = _csrf(client)
        asked = time.time()
        r = client.post(f"/api/waiting/{soon.id}/reschedule", json={"due": "18s"}, headers=headers)
        assert r.status_code == 200, r.text
        assert time.time() < old_due, "the host is too slow: the reschedule returned after the old due time"
        moved_to = asked + 18
        [listed] = pending(app, task=f"{app.main}.*")
        assert listed.task_id == soon.id and abs(listed.due - moved_to) < 2  # the new pass is listed
        time.sleep(max(0.0, old_due + 2 - time.time()))
        assert collector.items == []  # the old copy came due and was dropped
        collector.wait_for(1, timeout=20)
        assert collector.items[0]["at"] >= moved_to - 0.5
        time.sleep(1)
    assert [(i["tag"], i["id"]) for i in collector.items] == [("moved", soon.id)]


def test_cancel_and_bulk_cancel_by_filter(make_app, collector: Collector) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag)

    with running_worker(app):
        cancelled_due = time.time() + 45
        one = job.apply_async(("one",), countdown=45)
        many = [job.apply_async((f"bulk-{i}",), countdown=45) for i in range(3)]
        # Still waiting when listed, on a loaded host too: each filter reads the session's whole index
        # (thousands of other tests' tasks), seconds apiece there.
        kept = job.apply_async(("kept",), countdown=40)
        client = TestClient(create_app(app))
        headers = _csrf(client)
        assert client.post(f"/api/waiting/{one.id}/cancel", headers=headers).status_code == 200
        dry = client.post("/api/waiting/cancel", json={"args": "bulk-"}, headers=headers).json()
        assert (dry["matched"], dry["done"], dry["dry_run"]) == (3, 0, True)
        assert set(dry["ids"]) == {m.id for m in many}
        wrong = client.post("/api/waiting/cancel", json={"args": "bulk-", "dry_run": False, "expect": 2},
                            headers=headers)
        assert wrong.status_code == 409 and "not the 2" in wrong.json()["error"]
        done = client.post("/api/waiting/cancel", json={"args": "bulk-", "dry_run": False, "expect": 3},
                           headers=headers).json()
        assert done["done"] == 3
        page = client.get("/api/waiting", params={"task": job.name}).json()  # the session ladder is shared
        assert [t["task_id"] for t in page["items"]] == [kept.id]
        assert client.post(f"/api/waiting/{one.id}/cancel", headers=headers).status_code == 404  # not waiting
        collector.wait_for(1, timeout=60)
        time.sleep(max(1.0, cancelled_due + 2 - time.time()))  # the cancelled ones came due and were dropped
    assert [i["tag"] for i in collector.items] == ["kept"]


def test_retry_carries_its_last_error(make_app, collector: Collector) -> None:
    from celery_delayq import DelayedRetryTask

    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.flaky", bind=True, base=DelayedRetryTask, max_retries=3)
    def flaky(self: Any) -> None:
        collector.add(attempt=self.request.retries)
        raise self.retry(exc=ConnectionError("upstream said no " + "x" * 400), countdown=30)

    with running_worker(app):
        result = flaky.delay()
        collector.wait_for(1, timeout=10)
        deadline = time.time() + 10
        found: list[Any] = []
        while time.time() < deadline and not found:
            found = [t for t in pending(app, task_id=result.id) if t.attempt == 1]
            time.sleep(0.3)
    [retry] = found
    assert retry.last_error is not None and retry.last_error.startswith("ConnectionError: upstream said no")
    assert len(retry.last_error) <= 200
    client = TestClient(create_app(app))
    page = client.get("/api/waiting", params={"retries": True, "task": flaky.name}).json()  # the ladder is shared
    assert [t["task_id"] for t in page["items"]] == [result.id]
    assert page["items"][0]["last_error"] == retry.last_error
    assert "upstream said no" in client.get("/retries").text
    from celery_delayq import cancel
    cancel(app, result.id)
