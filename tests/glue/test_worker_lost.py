"""Worker-lost retries (Celery 5.7 ``retry_on_worker_lost``) wait in the ladder too.

A real prefork worker subprocess: the pool child running the task is SIGKILLed
on the first attempt; the parent republishes the task with
``default_retry_delay`` through ``apply_async``, which the kombu hook diverts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import celery
import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(celery.Task, "retry_on_worker_lost"), reason="retry_on_worker_lost is new in Celery 5.7")

APP = textwrap.dedent('''
    import json, os, signal, time
    from celery import Celery
    from celery_delayq import DelayedRetryTask
    app = Celery("wl", broker=os.environ["WL_BROKER"])
    app.conf.update(task_default_queue=os.environ["WL_QUEUE"], delayq_prefix=os.environ["WL_PREFIX"],
                    broker_heartbeat=0, worker_hijack_root_logger=False)

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True, retry_on_worker_lost=True,
              default_retry_delay=0.7, max_retries=3)
    def fragile(self):
        with open(os.environ["WL_LOG"], "a") as fh:
            fh.write(json.dumps({"retries": self.request.retries, "at": time.time(),
                                 "eta": str(self.request.eta),
                                 "entry": (self.request.headers or {}).get("x-delayq-entry")}) + "\\n")
        if self.request.retries == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # the pool child dies mid-task
''')


def test_worker_lost_retry_goes_through_the_ladder(tmp_path: Path, broker_url: str, prefix: str, uid: str) -> None:
    (tmp_path / "wlapp.py").write_text(APP)
    log = tmp_path / "runs.jsonl"
    env = dict(os.environ, WL_BROKER=broker_url, WL_QUEUE=f"wl.{uid}", WL_PREFIX=prefix, WL_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "wlapp", "worker", "-P", "prefork", "-c", "1",
                               "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        sent = subprocess.run([sys.executable, "-c", "from wlapp import fragile; fragile.delay()"], env=env,
                              cwd=tmp_path, timeout=60)
        assert sent.returncode == 0
        deadline = time.time() + 60
        runs: list[dict] = []
        while time.time() < deadline:
            runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            if len(runs) >= 2:
                break
            time.sleep(0.2)
        if len(runs) < 2:
            worker.send_signal(signal.SIGTERM)
            out = worker.communicate(timeout=30)[0].decode(errors="replace")
            pytest.fail(f"no retry after the worker was lost; worker said:\n{out[-3000:]}")
        assert [r["retries"] for r in runs[:2]] == [0, 1], runs
        retry = runs[1]
        assert retry["entry"], "the worker-lost retry did not come out of the ladder"
        assert retry["at"] - runs[0]["at"] >= 0.7  # default_retry_delay, never early
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
