"""The setting alone: a publisher that never imports celery_delayq, a real ``celery worker``.

The project's app module only sets ``delayq_enabled``; nothing imports
celery_delayq in the publisher processes (checked in each). The worker is
started as users start it, ``python -m celery -A proj worker`` (the CLI
plugin loads the package there). A task published with a countdown must
wait in the ladder, not in the worker: ``delayq pending`` lists it and
``inspect scheduled`` does not; it runs once, never before its eta; and the
worker names the publisher to fix, once per publishing host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import amqp
import pytest

pytestmark = pytest.mark.timeout(180)

PROJECT = '''
import json, os, time
from celery import Celery

app = Celery("proj", broker=os.environ["BROKER"])
app.conf.update(delayq_enabled=True, delayq_prefix=os.environ["PREFIX"], task_default_queue=os.environ["QUEUE"],
                broker_heartbeat=0, worker_hijack_root_logger=False)


@app.task(name="proj.record")
def record(tag):
    with open(os.environ["RUNS"], "a") as f:
        f.write(json.dumps({"tag": tag, "id": record.request.id, "at": time.time(),
                            "eta": record.request.eta}) + "\\n")
'''

PUBLISH = '''
import json, sys, time
from proj import record
ids = [record.apply_async((tag,), countdown={countdown}).id for tag in {tags!r}]
print(json.dumps({{"ids": ids, "imported": "celery_delayq" in sys.modules}}))
'''

WARNING = "outside the ladder"

#: Long enough for the checks to run while the tasks wait, on a loaded 2-core machine
#: (each ``celery`` CLI call there took up to 10 s with six test suites running).
COUNTDOWN = 40.0


@pytest.fixture
def project(tmp_path: Path, broker_url: str, prefix: str, uid: str, amqp_conn: amqp.Connection) -> Iterator[dict[str, str]]:
    (tmp_path / "proj.py").write_text(PROJECT)
    queue = f"tk.{uid}"
    env = dict(os.environ, BROKER=broker_url, PREFIX=prefix, QUEUE=queue, RUNS=str(tmp_path / "runs.jsonl"),
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]), CWD=str(tmp_path))
    yield env
    ch = amqp_conn.channel()
    with contextlib.suppress(Exception):
        ch.queue_delete(queue)


@contextlib.contextmanager
def celery_worker_process(env: dict[str, str]) -> Iterator[Path]:
    """``python -m celery -A proj worker`` in a subprocess; yields its log file once it is ready."""
    log = Path(env["CWD"]) / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", "worker", "-P", "solo", "-l", "info",
             "--without-gossip", "--without-mingle", "-n", f"w{os.getpid()}@%h"],
            cwd=env["CWD"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 90
        while "ready." not in log.read_text():
            assert proc.poll() is None, f"the worker exited:\n{log.read_text()}"
            assert time.time() < deadline, f"the worker did not start:\n{log.read_text()}"
            time.sleep(0.2)
        yield log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def observer(project: dict[str, str], make_app: Any) -> Any:
    """An app in the test process with the project's settings, to read the index and inspect the worker."""
    return make_app(delayq_enabled=True, broker_url=project["BROKER"], delayq_prefix=project["PREFIX"],
                    task_default_queue=project["QUEUE"])


def listed(observer: Any) -> set[str]:
    from celery_delayq import pending

    return {p.task_id for p in pending(observer)}


def publish(env: dict[str, str], tags: list[str], countdown: float) -> list[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PUBLISH.format(tags=tags, countdown=countdown))],
                          cwd=env["CWD"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["imported"] is False, "the publisher must not load celery_delayq for this test to mean anything"
    ids: list[str] = out["ids"]
    return ids


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", *args], cwd=env["CWD"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def runs(env: dict[str, str]) -> list[dict[str, Any]]:
    path = Path(env["RUNS"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_runs(env: dict[str, str], n: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.time() + timeout
    while len(runs(env)) < n:
        assert time.time() < deadline, f"only {len(runs(env))} of {n} runs within {timeout} s"
        time.sleep(0.1)
    return runs(env)


def test_a_publisher_that_never_imports_the_package_still_gets_the_ladder(project: dict[str, str],
                                                                         observer: Any) -> None:
    with celery_worker_process(project) as log:
        published = time.time()
        first = publish(project, ["a", "b"], COUNTDOWN)
        second = publish(project, ["c"], COUNTDOWN)  # a second process on the same host
        ids = first + second

        # Waiting in the ladder: the index lists every one of them ...
        while not set(ids) <= listed(observer):  # the worker moves them as it receives them
            assert time.time() < published + COUNTDOWN, \
                f"the index does not list {set(ids) - listed(observer)}:\n{log.read_text()}"
            time.sleep(0.2)
        rows = {row["task_id"] for row in json.loads(cli(project, "delayq", "pending", "--json"))}
        assert set(ids) <= rows, f"delayq pending does not list {set(ids) - rows}"
        # ... and the worker holds none of them.
        scheduled = observer.control.inspect(timeout=5).scheduled()
        assert scheduled, "no worker answered inspect scheduled"
        held = [entry for replies in scheduled.values() for entry in (replies or [])]
        assert held == [], f"the worker holds {len(held)} task(s) as classic ETA"
        assert time.time() < published + COUNTDOWN, "the checks ran after the tasks were due: they prove nothing"

        wait_for_runs(project, len(ids), timeout=COUNTDOWN + 30)
        time.sleep(2.0)  # a duplicate would come right behind
        got = runs(project)
        text = log.read_text()

    assert sorted(r["id"] for r in got) == sorted(ids), "each task runs exactly once"
    for r in got:
        eta = datetime.fromisoformat(r["eta"]).timestamp()
        assert r["at"] >= eta, f"task {r['tag']} ran {eta - r['at']:.3f} s early"
        assert r["at"] - eta < 5.0, f"task {r['tag']} ran {r['at'] - eta:.3f} s late"
    assert text.count(WARNING) == 1, f"want one warning for this publishing host, got {text.count(WARNING)}:\n{text}"
    warning = next(line for line in text.splitlines() if WARNING in line)
    assert "import celery_delayq" in warning and "celery_delayq.install(app)" in warning


def test_a_task_cancelled_or_revoked_while_it_waits_after_the_takeover_does_not_run(
        project: dict[str, str], observer: Any) -> None:
    from celery_delayq import cancel

    with celery_worker_process(project) as log:
        published = time.time()
        keep, cancelled, revoked = publish(project, ["keep", "cancelled", "revoked"], COUNTDOWN)
        while not {keep, cancelled, revoked} <= listed(observer):
            assert time.time() < published + COUNTDOWN, f"the tasks never reached the ladder:\n{log.read_text()}"
            time.sleep(0.2)
        cancel(observer, cancelled)
        observer.control.revoke(revoked)  # Celery's own revoke, broadcast to the workers
        assert time.time() < published + COUNTDOWN, "the cancel and revoke came after the tasks were due"
        wait_for_runs(project, 1, timeout=COUNTDOWN + 30)
        time.sleep(2.0)
        got = runs(project)
    assert [r["tag"] for r in got] == ["keep"]
