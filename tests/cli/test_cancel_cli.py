"""``delayq cancel`` / ``pending --id`` / ``status`` as an operator runs them, beside a real worker process.

A typo is an error and the task it missed still runs; a unique start of an
id cancels that task; after a cancel, ``status`` and ``pending`` account for
the same waiting tasks. Each command is ``python -m celery -A APP delayq ...``
in a process of its own, the worker another one, on a ladder of this test's own.
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
import uuid
from pathlib import Path
from typing import Any, Iterator

import amqp
import pytest

from celery_delayq.glue.app_ladder import ladder_for
from helpers import BROKER_HOST

pytestmark = pytest.mark.timeout(240)

APP = textwrap.dedent('''
    import json, os, time
    from celery import Celery
    app = Celery("{name}", broker=os.environ["K_BROKER"], backend=os.environ["K_BACKEND"])
    app.conf.update(task_default_queue=os.environ["K_QUEUE"], delayq_prefix=os.environ["K_PREFIX"],
                    delayq_levels=3, delayq_unit_ms=1000, delayq_enabled=True, broker_heartbeat=0,
                    worker_hijack_root_logger=False)

    @app.task(name="{name}.job", bind=True)
    def job(self, tag):
        with open(os.environ["K_LOG"], "a") as fh:
            fh.write(json.dumps({{"tag": tag, "id": self.request.id}}) + "\\n")
        return tag
''')


class Operator:
    """The app module on disk, its worker process and the operator's commands."""

    def __init__(self, tmp_path: Path, broker_url: str, uid: str) -> None:
        self.name = f"cc{uid}"
        (tmp_path / f"{self.name}.py").write_text(APP.format(name=self.name))
        (tmp_path / "results").mkdir()
        self.cwd = tmp_path
        self.log = tmp_path / "runs.jsonl"
        self.env = dict(os.environ, K_BROKER=broker_url, K_BACKEND=f"file://{tmp_path / 'results'}",
                        K_QUEUE=f"cc.{uid}", K_PREFIX=f"cc{uid}", K_LOG=str(self.log), COLUMNS="250",
                        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
        self.worker: subprocess.Popen[bytes] | None = None

    def delayq(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "celery", "-A", self.name, "delayq", *args], cwd=self.cwd,
                              env=self.env, capture_output=True, text=True, timeout=120)

    def publish(self, *items: tuple[str, float, str]) -> None:
        """``(tag, countdown, task_id)`` each, sent from a publisher process of its own."""
        code = (f"import celery_delayq, {self.name} as m\n"  # as documented: the process imports the package
                f"for tag, cd, tid in {list(items)!r}:\n"
                f"    m.job.apply_async((tag,), countdown=cd, task_id=tid)\n")
        subprocess.run([sys.executable, "-c", code], cwd=self.cwd, env=self.env, check=True, timeout=120)

    def start_worker(self) -> None:
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", self.name, "worker", "-P", "solo", "--without-heartbeat",
             "--without-gossip", "--without-mingle", "-l", "WARNING"],
            cwd=self.cwd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.worker.kill()

    def runs(self) -> list[str]:
        return [json.loads(line)["tag"] for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def wait_ran(self, tag: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if tag in self.runs():
                return
            time.sleep(0.2)
        raise AssertionError(f"{tag!r} did not run within {timeout} s: {self.runs()}")

    def state(self, task_id: str) -> str | None:
        """The result backend's state of ``task_id`` (Celery's file system backend: one JSON file per id)."""
        found = list((self.cwd / "results").glob(f"*{task_id}*"))
        return json.loads(found[0].read_text())["status"] if found else None


@pytest.fixture
def op(tmp_path: Path, broker_url: str, uid: str, vhost: str, make_app: Any) -> Iterator[Operator]:
    operator = Operator(tmp_path, broker_url, uid)
    yield operator
    operator.stop_worker()
    app = make_app(delayq_prefix=f"cc{uid}", delayq_levels=3, delayq_unit_ms=1000)
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        with contextlib.suppress(Exception):
            topo = ladder_for(app).topology(conn)  # the worker's exit queue for cc.<uid> too
            topo.delete(conn, if_empty=False, keep_shared=False, exit_queues=[topo.destination("", f"cc.{uid}").exit_queue])
        with contextlib.suppress(Exception):
            conn.channel().queue_delete(f"cc.{uid}")
    finally:
        conn.close()


def _wait_state(op: Operator, task_id: str, state: str, timeout: float = 30.0) -> str | None:
    deadline = time.time() + timeout
    while time.time() < deadline and op.state(task_id) != state:
        time.sleep(0.2)
    return op.state(task_id)


def test_a_typo_is_an_error_and_the_task_still_runs_a_prefix_cancels(op: Operator, uid: str) -> None:
    kept, doomed = str(uuid.uuid4()), f"{uid}{uuid.uuid4().hex}"
    op.publish(("kept", 45, kept), ("doomed", 45, doomed))  # still waiting after four CLI runs on a busy host
    typo = kept[:-1] + ("0" if kept[-1] != "0" else "1")
    out = op.delayq("cancel", typo)
    assert out.returncode == 1, out
    assert "no task waiting in the ladder" in out.stderr and typo in out.stderr
    assert f"cc{uid}" in out.stderr and "--force" in out.stderr  # what it read, and the way out
    short = op.delayq("cancel", doomed[:3])
    assert short.returncode == 1 and "at least 4 characters" in short.stderr
    out = op.delayq("cancel", doomed[:12])
    assert out.returncode == 0, out.stderr
    assert f"cancelled {doomed}" in out.stdout and "was waiting" in out.stdout
    forced = op.delayq("cancel", "--force", "--json", f"{uid}-not-yet-published")
    assert forced.returncode == 0 and json.loads(forced.stdout)[0]["waiting"] is False
    op.start_worker()
    op.wait_ran("kept", timeout=120)  # the typo cancelled nothing
    assert _wait_state(op, doomed, "REVOKED") == "REVOKED"
    time.sleep(1.0)
    assert op.runs() == ["kept"]


def test_pending_id_takes_a_prefix_and_refuses_an_ambiguous_one(op: Operator, uid: str) -> None:
    stem = f"{uid}{uuid.uuid4().hex[:4]}"
    one, two = f"{stem}a-{uuid.uuid4()}", f"{stem}b-{uuid.uuid4()}"
    op.publish(("one", 50, one), ("two", 50, two))
    out = op.delayq("pending", "--id", f"{stem}a", "--json")
    assert out.returncode == 0, out.stderr
    assert [t["task_id"] for t in json.loads(out.stdout)] == [one]
    exact = op.delayq("pending", "--id", two, "--json")
    assert [t["task_id"] for t in json.loads(exact.stdout)] == [two]
    both = op.delayq("pending", "--id", stem)
    assert both.returncode == 1 and one in both.stderr and two in both.stderr and "give more" in both.stderr
    refused = op.delayq("cancel", stem)
    assert refused.returncode == 1 and one in refused.stderr and two in refused.stderr


def test_after_a_cancel_status_and_pending_agree(op: Operator, uid: str) -> None:
    ids = [f"{uid}-{n}-{uuid.uuid4()}" for n in range(3)]
    op.publish(*[(f"t{n}", 50, task_id) for n, task_id in enumerate(ids)])
    assert op.delayq("cancel", ids[0]).returncode == 0
    listed = [t["task_id"] for t in json.loads(op.delayq("pending", "--json").stdout)]
    status = json.loads(op.delayq("status", "--json").stdout)
    assert sorted(listed) == sorted(ids[1:])
    assert status["totals"]["waiting"] == 3  # the cancelled message stays in its queue until it is due
    assert status["totals"]["cancelled"] == 1
    assert status["totals"]["waiting"] - status["totals"]["cancelled"] == len(listed)
    text = " ".join(op.delayq("status").stdout.split())
    assert "of which 1 cancelled" in text and "lists the other 2" in text
