"""Durable cancel (``celery_delayq.cancel`` / ``delayq cancel``) and durable Celery revoke, on a real broker.

A cancelled task never runs: not when a worker is up, not when no worker
heard the cancel (Celery's own revoke would be lost), not after every
worker was killed with ``kill -9`` and restarted before the due time. The
result backend shows ``REVOKED``, as Celery's revoke does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

import celery_delayq
from celery_delayq import cancel, pending, signals
from celery_delayq.cancels import CancelBook, cancelled_ids
from celery_delayq.pending.layout import MARGIN_S
from helpers import Collector, running_worker


# -- pure ---------------------------------------------------------------------------------
def test_book_holds_each_cancel_until_it_expires() -> None:
    book = CancelBook()
    book.add("a", 100.0)
    book.add("a", 50.0)  # an earlier expiry does not shorten a later one
    book.add("b", 10.0)
    assert book.cancelled("a", now=99.0) and not book.cancelled("a", now=100.0)
    assert not book.cancelled("b", now=10.0) and not book.cancelled("c", now=0.0)
    assert book.live(now=20.0) == {"a"}
    book.PRUNE_EVERY = 1
    book.add("c", time.time() + 60)  # pruning drops what expired, keeps the rest
    assert "b" not in book._until and "a" not in book._until and book.cancelled("c")


# -- broker -------------------------------------------------------------------------------
@pytest.fixture
def backend(tmp_path: Path) -> str:
    """A result backend every process can read (Celery's file system backend)."""
    path = tmp_path / "results"
    path.mkdir()
    return f"file://{path}"


@pytest.fixture
def cancel_signals() -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def on(sender: Any = None, **kw: Any) -> None:
        got.append(kw)

    signals.message_cancelled.connect(on, weak=False)
    yield got
    signals.message_cancelled.disconnect(on)


def _wait_state(result: Any, state: str, timeout: float = 20.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if result.state == state:
            return state
        time.sleep(0.1)
    return str(result.state)


def test_cancelled_task_never_runs_and_is_revoked(make_app, backend: str, collector: Collector,
                                                  cancel_signals: list[dict[str, Any]]) -> None:
    app = make_app(delayq_enabled=True, result_backend=backend)

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag, id=self.request.id)

    with running_worker(app):
        doomed = job.apply_async(("doomed",), countdown=2.5)
        kept = job.apply_async(("kept",), countdown=2.5)
        [result] = cancel(app, doomed.id)
        assert result.found is not None and result.found.task_id == doomed.id
        assert abs(result.until - (result.found.due + MARGIN_S)) < 1e-6  # expires a day after its due time
        assert [t.task_id for t in pending(app, task=f"{app.main}.*")] == [kept.id]
        collector.wait_for(1, timeout=20)
        assert _wait_state(doomed, "REVOKED") == "REVOKED"
        time.sleep(0.5)
    assert [r["tag"] for r in collector.items] == ["kept"]
    reasons = [(s["task_id"], s["reason"]) for s in cancel_signals]
    assert (doomed.id, "requested") in reasons and (doomed.id, "cancelled") in reasons
    assert all(s["task_id"] == doomed.id for s in cancel_signals)


def test_celery_revoke_is_durable_without_any_worker(make_app, backend: str, collector: Collector) -> None:
    """Celery's revoke only reaches the workers running then; through the ladder it is recorded first."""
    app = make_app(delayq_enabled=True, result_backend=backend)

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag)

    by_control = job.apply_async(("control",), countdown=3)
    by_result = job.apply_async(("result",), countdown=3)
    days = job.apply_async(("days",), countdown=3 * 86400)
    kept = job.apply_async(("kept",), countdown=3)
    app.control.revoke(by_control.id)  # no worker runs: Celery's broadcast reaches no one
    by_result.revoke()
    [far] = cancel(app, days.id)
    assert far.found is not None and far.until > time.time() + 4 * 86400 - 60
    assert {by_control.id, by_result.id, days.id} <= cancelled_ids(app)
    with running_worker(app):
        # The 3-day task "arrives" now: the same id, straight to its queue, as the ladder would deliver it.
        job.apply_async(("days",), task_id=days.id)
        collector.wait_for(1, timeout=20)
        for r in (by_control, by_result, days):
            assert _wait_state(r, "REVOKED") == "REVOKED", r
        time.sleep(0.5)
    assert [r["tag"] for r in collector.items] == ["kept"]
    assert kept.state == "SUCCESS"


def test_cancel_of_an_unknown_id_holds_for_the_longest_delay(make_app) -> None:
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app).publisher.declare()
    unknown = str(uuid.uuid4())
    before = time.time()
    [result] = cancel(app, unknown)
    spec = celery_delayq.ladder_for(app).config.spec
    assert result.found is None
    assert before + spec.max_delay_s + MARGIN_S <= result.until <= time.time() + spec.max_delay_s + MARGIN_S
    assert unknown in cancelled_ids(app)
    assert unknown not in cancelled_ids(app, now=result.until + 1)  # and then it expires


WORKER_APP = textwrap.dedent('''
    import json, os, time
    from celery import Celery
    app = Celery("{name}", broker=os.environ["K_BROKER"], backend=os.environ["K_BACKEND"])
    app.conf.update(task_default_queue=os.environ["K_QUEUE"], delayq_prefix=os.environ["K_PREFIX"],
                    delayq_enabled=True, broker_heartbeat=0, worker_hijack_root_logger=False)

    @app.task(name="{name}.job", bind=True)
    def job(self, tag):
        with open(os.environ["K_LOG"], "a") as fh:
            fh.write(json.dumps({{"tag": tag, "id": self.request.id, "at": time.time()}}) + "\\n")
        return tag
''')


def _runs(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _start_worker(env: dict[str, str], cwd: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", name, "worker", "-P", "solo", "--without-heartbeat",
                             "--without-gossip", "--without-mingle", "-l", "WARNING"],
                            env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ran(log: Path, tag: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(r["tag"] == tag for r in _runs(log)):
            return
        time.sleep(0.1)
    raise AssertionError(f"task {tag!r} did not run within {timeout} s: {_runs(log)}")


def test_cancel_survives_kill_9_of_every_worker(tmp_path: Path, broker_url: str, prefix: str, uid: str,
                                                backend: str, make_app) -> None:
    """Cancel, kill -9 the only worker, restart it before the due time: the task never runs, REVOKED."""
    name = f"k{uid}"
    (tmp_path / f"{name}.py").write_text(WORKER_APP.format(name=name))
    log = tmp_path / "runs.jsonl"
    env = dict(os.environ, K_BROKER=broker_url, K_BACKEND=backend, K_QUEUE=f"k.{uid}", K_PREFIX=prefix,
               K_LOG=str(log), PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    app = make_app(delayq_enabled=True, result_backend=backend, task_default_queue=f"k.{uid}")

    @app.task(name=f"{name}.job")
    def job(tag: str) -> str:  # the same task, sent from here
        return tag

    worker = _start_worker(env, tmp_path, name)
    try:
        job.apply_async(("warm-up",))
        _wait_ran(log, "warm-up", timeout=60)  # the worker has loaded the cancel log and consumes
        doomed = job.apply_async(("doomed",), countdown=8)
        kept = job.apply_async(("kept",), countdown=8)
        [result] = cancel(app, doomed.id)
        assert result.found is not None
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        time.sleep(1.0)  # every worker is gone
        worker = _start_worker(env, tmp_path, name)
        _wait_ran(log, "kept", timeout=40)
        assert _wait_state(kept, "SUCCESS", timeout=20) == "SUCCESS"
        assert _wait_state(doomed, "REVOKED", timeout=20) == "REVOKED"
        time.sleep(1.0)
        tags = [r["tag"] for r in _runs(log)]
        assert "doomed" not in tags and tags.count("kept") == 1, tags
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()


CLI_APP = '''
from celery import Celery
app = Celery("{name}", broker="{url}")
app.conf.update(task_default_queue="{queue}", delayq_prefix="{prefix}", delayq_enabled=True, broker_heartbeat=0)
'''


def test_cli_cancel(make_app, broker_url: str, prefix: str, tmp_path: Path) -> None:
    name = f"cc{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{name}.py").write_text(CLI_APP.format(name=name, url=broker_url, queue=f"q.{name}", prefix=prefix))
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{name}.later")
    def later() -> None: ...

    waiting = later.apply_async(countdown=3600)
    unknown = str(uuid.uuid4())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "celery", "-A", name, "delayq", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))

    out = cli("cancel", waiting.id, unknown, "--json")
    assert out.returncode == 0, out.stderr
    doc = {d["task_id"]: d for d in json.loads(out.stdout)}
    assert doc[waiting.id]["waiting"] is True and doc[waiting.id]["task"] == f"{name}.later"
    assert doc[unknown]["waiting"] is False and doc[unknown]["until"].endswith("Z")
    assert pending(app, task_id=waiting.id) == []
    assert {waiting.id, unknown} <= cancelled_ids(app)
    text = cli("cancel", waiting.id)
    assert text.returncode == 0 and "it will not run" in text.stdout
    assert cli("cancel").returncode == 2  # an id is required
