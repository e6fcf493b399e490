"""Telemetry as a subscriber: attach/detach per app, what each signal records.

The first part sends the signals by hand (no broker): field contracts, per-app
filtering, detach, de-duplication of publisher events.  The last test runs a
real worker on the real broker with succeeding, retried, parked (exhausted and
``delayq_park_on``) and plainly failing tasks, and a replay.
"""

from __future__ import annotations

import ast
import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery import signals as celery_signals

from celery_delayq.ladder import headers as H
from celery_delayq import signals
from celery_delayq.telemetry import (
    Subscription,
    attach,
    detach,
    flush_all,
    recorder_for,
    subscription_for,
)
from celery_delayq.telemetry import subscriber as sub
from retry_helpers import parking_name_fixture, retry_app_fixture  # noqa: F401  (fixtures)

TS = 1710028770.123456


def read(root: Path) -> list[dict[str, Any]]:
    flush_all()
    lines: list[dict[str, Any]] = []
    for path in sorted(root.rglob("*.jsonl")):
        lines.extend(json.loads(x) for x in path.read_text().splitlines())
    return lines


@pytest.fixture(autouse=True)
def _explicit_only():
    """While the glue still imports the deprecated import-time wiring, switch it off here."""
    import sys

    wiring = sys.modules.get("celery_delayq.telemetry.wiring")
    if wiring is not None:
        wiring.disconnect()
    yield
    if wiring is not None:
        wiring.connect()


@pytest.fixture
def new_app():
    """Apps with one task each (no broker), detached at the end."""
    apps: list[Any] = []

    def factory() -> tuple[Any, Any]:
        app = Celery(f"sub{uuid.uuid4().hex[:6]}", set_as_current=False)
        apps.append(app)

        @app.task(shared=False)
        def work(i: int) -> int:
            return i

        return app, app.tasks[work.name]

    yield factory
    for app in apps:
        detach(app)


def config(root: Path | None, prefix: str = "delayq", parking_queue: str | None = None) -> Any:
    return SimpleNamespace(telemetry_dir=str(root) if root else None,
                           parking_queue_name=parking_queue or f"{prefix}.parking")


def worker_request(app: Any, task: Any, *, retries: int = 0, task_id: str = "req-1") -> Any:
    from celery.contrib.testing.mocks import TaskMessage
    from celery.worker.request import Request

    message = TaskMessage(task.name, id=task_id, args=(1,), retries=retries,
                          **{H.DUE: TS, H.DELAY: 0.5, H.ENTRY: "e1", H.HOPS: 2})
    message.delivery_info = {"exchange": "", "routing_key": "jobs", "redelivered": False}
    return Request(message, app=app, task=task)


class running:
    """``with running(task, request):`` the task's request is pushed, as in a worker."""

    def __init__(self, task: Any, request: Any) -> None:
        self.task, self.request = task, request

    def __enter__(self) -> Any:
        self.task.push_request(self.request.request_dict, args=(1,), kwargs={}, called_directly=False)
        return self.task.request

    def __exit__(self, *exc: object) -> None:
        self.task.pop_request()


def test_every_worker_signal_writes_its_event(new_app, tmp_path):
    app, task = new_app()
    root = tmp_path / "t"
    subscription = attach(app, config(root))
    assert isinstance(subscription, Subscription) and subscription_for(app) is subscription
    request = worker_request(app, task, retries=2)
    signals.message_delivered.send(sender=task, request=request, due=TS, delay=0.5, lateness=0.0)
    with running(task, request) as ctx:
        celery_signals.task_success.send(sender=task, result=1, runtime=0.0)
        celery_signals.task_retry.send(sender=task, request=ctx,
                                       reason=SimpleNamespace(exc=TimeoutError()), einfo=None)
        signals.retry_exhausted.send(sender=task, request=ctx, exc=KeyError("x"), attempt=3)
        celery_signals.task_failure.send(sender=task, task_id="req-1", exception=OSError("down"),
                                         args=(), kwargs={}, traceback=None, einfo=None)
        celery_signals.task_revoked.send(sender=task, request=ctx, terminated=False, signum=None,
                                         expired=True)
    signals.message_cancelled.send(sender=app, task_id="c-1", task_name=task.name, queue="jobs",
                                   attempt=0, reason="cancelled")
    base = {"task_id": "req-1", "task_name": task.name, "queue": "jobs", "attempt": 2}
    got = read(root)
    assert [e["event"] for e in got] == ["delivered", "succeeded", "retried", "exhausted", "failed",
                                        "cancelled", "cancelled"]
    delivered, succeeded, retried, exhausted, failed, expired, cancelled = got
    assert delivered == {"event": "delivered", **base, "ts": delivered["ts"], "delay_s": 0.5, "due_at": TS}
    assert succeeded == {"event": "succeeded", **base, "ts": succeeded["ts"]}
    assert retried == {"event": "retried", **base, "ts": retried["ts"], "exception": "TimeoutError"}
    assert exhausted == {"event": "exhausted", **base, "ts": exhausted["ts"], "exception": "KeyError"}
    assert failed == {"event": "failed", **base, "ts": failed["ts"], "exception": "OSError"}
    assert expired == {"event": "cancelled", **base, "ts": expired["ts"], "reason": "expired"}
    assert cancelled == {"event": "cancelled", "task_id": "c-1", "task_name": task.name, "queue": "jobs",
                         "attempt": 0, "ts": cancelled["ts"], "reason": "cancelled"}
    assert recorder_for(root).dropped == 0


def test_a_parked_task_is_parked_not_failed(new_app, tmp_path):
    app, task = new_app()
    root = tmp_path / "t"
    attach(app, config(root))
    with running(task, worker_request(app, task, retries=1, task_id="p-1")) as ctx:
        signals.message_parked.send(sender=task, request=ctx, exc=ValueError("bad"), queue="delayq.parking")
        celery_signals.task_failure.send(sender=task, task_id="p-1", exception=ValueError("bad"))
    # The next failure of the same task id (a replay that fails again, unparked) is a failure.
    with running(task, worker_request(app, task, retries=2, task_id="p-1")):
        celery_signals.task_failure.send(sender=task, task_id="p-1", exception=ValueError("bad"))
    got = read(root)
    assert [(e["event"], e["attempt"]) for e in got] == [("parked", 1), ("failed", 2)]
    assert got[0]["exception"] == "ValueError" and got[0]["queue"] == "jobs"


def test_a_cancelled_task_is_recorded_once_when_a_worker_drops_it(new_app, tmp_path):
    app, task = new_app()
    root = tmp_path / "t"
    attach(app, config(root))
    signals.message_cancelled.send(sender=app, task_id="c-1", task_name=task.name, queue="",
                                   attempt=0, reason="requested")  # the cancel command
    with running(task, worker_request(app, task, task_id="c-1")) as ctx:
        signals.message_cancelled.send(sender=app, task_id="c-1", task_name=task.name, queue="jobs",
                                       attempt=0, reason="cancelled")  # the worker drops it ...
        celery_signals.task_revoked.send(sender=task, request=ctx, terminated=False, signum=None,
                                         expired=False)  # ... through Celery's revoked set
    with running(task, worker_request(app, task, task_id="r-1")) as ctx:
        celery_signals.task_revoked.send(sender=task, request=ctx, terminated=False, signum=None,
                                         expired=False)  # a plain Celery revoke
    got = [(e["task_id"], e["reason"]) for e in read(root)]
    assert got == [("c-1", "cancelled"), ("r-1", "revoked")]


def test_only_the_attached_app_is_recorded_and_detach_stops_it(new_app, tmp_path):
    app_a, task_a = new_app()
    app_b, task_b = new_app()
    app_off, task_off = new_app()
    attach(app_a, config(tmp_path / "a"))
    attach(app_b, config(tmp_path / "b"))

    def succeed(task: Any, task_id: str) -> None:
        with running(task, worker_request(task.app, task, task_id=task_id)):
            celery_signals.task_success.send(sender=task, result=None, runtime=0.0)

    succeed(task_a, "a1")
    succeed(task_b, "b1")
    succeed(task_off, "off1")
    detach(app_a)
    assert subscription_for(app_a) is None
    succeed(task_a, "a2")
    again = attach(app_a, config(tmp_path / "a-again"))
    assert attach(app_a, config(tmp_path / "a-again")) is again  # idempotent
    succeed(task_a, "a3")
    assert [e["task_id"] for e in read(tmp_path / "a")] == ["a1"]
    assert [e["task_id"] for e in read(tmp_path / "a-again")] == ["a3"]
    assert [e["task_id"] for e in read(tmp_path / "b")] == ["b1"]
    assert not list(tmp_path.rglob("*off1*"))
    detach(app_off)  # never attached: a no-op


def test_attach_without_a_directory_says_what_to_set(new_app):
    app, _ = new_app()
    with pytest.raises(ValueError, match="delayq_telemetry_dir"):
        attach(app, config(None))


def test_attach_reads_the_app_settings_by_default(new_app, tmp_path):
    app, task = new_app()
    app.conf.delayq_telemetry_dir = str(tmp_path / "conf")
    assert attach(app).root == str(tmp_path / "conf")


class Publisher:
    """What the scheduled receiver reads of a LadderPublisher (signal senders must be hashable)."""

    def __init__(self, root: Path | None) -> None:
        self.config = config(root)


def test_scheduled_is_recorded_once_per_directory_while_attached(new_app, tmp_path):
    root = tmp_path / "sched"
    app_1, _ = new_app()
    app_2, _ = new_app()
    publisher, other = Publisher(root), Publisher(tmp_path / "elsewhere")
    plan = SimpleNamespace(entry="e" * 32, delay=2.0, due=TS, hops=4,
                           destination=SimpleNamespace(routing_key="jobs"))

    def schedule(task_id: str, pub: Any = publisher) -> None:
        signals.message_scheduled.send(sender=pub, plan=plan,
                                       headers={"id": task_id, "task": "app.add", H.ATTEMPT: 1})

    schedule("before")  # nothing attached
    attach(app_1, config(root))
    attach(app_2, config(root))  # same directory: one tap, one line per event
    schedule("t-1")
    schedule("other", other)  # a publisher of another directory
    signals.message_scheduled.send(sender=publisher, plan=plan, headers={})
    detach(app_1)
    schedule("t-2")
    detach(app_2)
    schedule("after")
    got = read(root)
    assert [e["task_id"] for e in got] == ["t-1", "e" * 32, "t-2"]
    assert got[0] == {"event": "scheduled", "task_id": "t-1", "task_name": "app.add", "queue": "jobs",
                      "attempt": 1, "ts": got[0]["ts"], "delay_s": 2.0, "due_at": TS,
                      "entry": "e" * 32, "hops": 4}
    assert (got[1]["task_name"], got[1]["attempt"]) == ("", 0)
    assert not sub._TAPS


def test_replayed_is_recorded_for_the_apps_parking_queue(new_app, tmp_path):
    app, _ = new_app()
    root = tmp_path / "r"
    attach(app, config(root, prefix="px"))  # parking queue: px.parking
    parked = SimpleNamespace(task_id="t-9", parked_id="p-9", task="app.sync", routing_key="jobs", attempts=3)
    signals.message_replayed.send(sender="px.parking", parked=parked, delay=None)
    signals.message_replayed.send(sender="px.parking", parked=parked, delay=30)
    signals.message_replayed.send(sender="other.parking", parked=parked, delay=None)
    got = read(root)
    assert [(e["event"], e["task_id"], e["attempt"], e["delay_s"]) for e in got] == [
        ("replayed", "t-9", 2, 0.0), ("replayed", "t-9", 2, 30.0)]


def test_the_subscriber_never_imports_the_celery_glue():
    """The integration <-> telemetry import cycle is gone (only the deprecated shim has it)."""
    package = Path(sub.__file__).parent
    for path in package.glob("*.py"):
        if path.name == "wiring.py":
            continue
        tree = ast.parse(path.read_text())
        imported = {getattr(node, "module", None) or "" for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for alias in node.names}
        assert not any("integration" in name for name in imported), path.name


# -- a real worker ------------------------------------------------------------------------------


def test_real_worker_records_parked_failed_retried_and_replayed(retry_app, collector, tmp_path, parking_name):
    from celery_delayq import DelayedRetryTask
    from celery_delayq.parking import ParkingQueue
    from helpers import running_worker

    root = tmp_path / "events"
    app = retry_app(delayq_telemetry_dir=str(root))
    attach(app)

    @app.task(base=DelayedRetryTask, bind=True, max_retries=1, default_retry_delay=0.05)
    def gives_up(self):
        collector.add(task="gives_up")
        raise self.retry(exc=ConnectionError("down"))

    @app.task(base=DelayedRetryTask, bind=True, delayq_park_on=(ValueError,))
    def bad_input(self):
        collector.add(task="bad_input")
        raise ValueError("bad input")

    @app.task(bind=True)
    def plain(self):
        collector.add(task="plain")
        raise KeyError("no such key")

    @app.task(base=DelayedRetryTask, bind=True, max_retries=3, default_retry_delay=0.05)
    def flaky(self):
        collector.add(task="flaky")
        if self.request.retries < 1:
            raise self.retry(exc=TimeoutError("slow"))

    with running_worker(app):
        gives_up.apply_async(countdown=0.1)
        bad_input.delay()
        plain.delay()
        flaky.apply_async(countdown=0.1)
        collector.wait_for(2 + 1 + 1 + 2, timeout=30)
        time.sleep(0.5)  # the last task's signals run after its body
        with ParkingQueue.for_app(app) as parked:
            deadline = time.time() + 10
            while parked.count() < 2 and time.time() < deadline:
                time.sleep(0.1)
            report = parked.replay()
        assert report.replayed == 2
        collector.wait_for(2 + 1 + 1 + 2 + 2, timeout=30)
        time.sleep(0.5)
    detach(app)
    got = read(root)
    by = {}
    for e in got:
        by.setdefault((e["task_name"].rsplit(".", 1)[-1], e["event"]), []).append(e)
    counts = {k: len(v) for k, v in by.items()}
    assert counts[("gives_up", "exhausted")] >= 1 and counts[("gives_up", "parked")] >= 1
    assert counts[("bad_input", "parked")] >= 1 and ("bad_input", "exhausted") not in counts
    assert counts[("plain", "failed")] == 1 and ("plain", "parked") not in counts
    assert ("gives_up", "failed") not in counts  # parked again after its replay, never failed
    assert counts[("flaky", "retried")] == 1 and counts[("flaky", "succeeded")] == 1
    assert counts[("flaky", "scheduled")] == 2 and counts[("flaky", "delivered")] == 2
    assert by[("bad_input", "parked")][0]["exception"] == "ValueError"
    assert by[("gives_up", "parked")][0]["exception"] == "ConnectionError"
    assert {e["task_name"].rsplit(".", 1)[-1] for e in by_event(got, "replayed")} == {"gives_up", "bad_input"}
    assert by[("plain", "failed")][0]["exception"] == "KeyError"


def by_event(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]
