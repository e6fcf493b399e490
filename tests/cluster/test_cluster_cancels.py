"""A cancel survives a broker restart (of a private node), with no worker up in between.

A worker declares the ladder and stops; a separate process publishes two tasks
and cancels one; the broker restarts (stop_app, start_app); a new worker
starts. Only the kept task runs, at its due time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from benchmarks.faults.nodes import Cluster

#: Includes a private cluster's start-up (60-70 s) for the first test that asks for it.
pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]


def _mark_app(tmp_path: Path, module: str, broker: Any, prefix: str, ran: Path, **conf: Any) -> dict[str, str]:
    """Write ``<module>.py``: an app on ``broker`` whose task ``mark(label)`` appends to ``ran``; its env."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        import celery_delayq  # noqa: F401
        app = Celery({module!r}, broker={broker.url!r})
        app.conf.update(delayq_enabled=True, delayq_prefix={prefix!r}, delayq_management_url={broker.mgmt_url!r},
                        task_default_queue={prefix + "-q"!r}, **{conf!r})

        @app.task(name="{module}.mark")
        def mark(label):
            with open({str(ran)!r}, "a") as f:
                f.write(label + "\\n")
    """))
    return dict(os.environ, PYTHONPATH=f"{tmp_path}:{REPO}")


def test_a_cancel_survives_a_broker_restart(single: Cluster, tmp_path: Path) -> None:
    broker = single.nodes[0]
    prefix = f"cxl{uuid.uuid4().hex[:6]}"
    ran = tmp_path / "ran.txt"
    env = _mark_app(tmp_path, "cxlapp", broker, prefix, ran, worker_hijack_root_logger=False)
    worker_cmd = [sys.executable, "-m", "celery", "-A", "cxlapp", "worker", "--pool=solo", "-l", "warning",
                  "--without-mingle", "--without-gossip"]
    first = subprocess.Popen(worker_cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(8)  # declares the ladder, its queue and the cancel log
    first.terminate()
    first.wait(30)
    publish = textwrap.dedent("""
        import celery_delayq, cxlapp
        kept = cxlapp.mark.apply_async(("kept",), countdown=25)
        gone = cxlapp.mark.apply_async(("cancelled",), countdown=25)
        celery_delayq.cancel(cxlapp.app, gone.id)
    """)
    subprocess.run([sys.executable, "-c", publish], env=env, cwd=tmp_path, check=True, timeout=60)
    due = time.time() + 25
    # A restart, not a kill -9: after a kill, 3.10 can hold ladder messages for minutes (see
    # test_cluster_faults and celery_delayq.rabbitmq.recovery), which is not what this test is about.
    broker.stop_app()
    broker.start_app()
    log = tmp_path / "worker.log"
    sink = open(log, "w")  # noqa: SIM115 - closed below
    second = subprocess.Popen([*worker_cmd, "-l", "info"], env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = due + 45
        while time.time() < deadline and "kept" not in (ran.read_text() if ran.exists() else ""):
            time.sleep(0.5)
        time.sleep(5)  # the cancelled one was due at the same moment
    finally:
        second.terminate()
        second.wait(30)
        sink.close()
    lines = ran.read_text().split() if ran.exists() else []
    assert lines == ["kept"], log.read_text()[-4000:]


def test_a_worker_that_reconnects_after_a_restart_looks_for_held_queues_and_goes_on(single: Cluster,
                                                                                    tmp_path: Path) -> None:
    """The worker's own recovery step (RabbitMQ < 4.3), and delayed work after it."""
    broker = single.nodes[0]
    prefix = f"rcn{uuid.uuid4().hex[:6]}"
    ran = tmp_path / "ran.txt"
    log = tmp_path / "worker.log"
    env = _mark_app(tmp_path, "rcnapp", broker, prefix, ran, broker_connection_retry_on_startup=True)
    with open(log, "w") as sink:
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "rcnapp", "worker", "--pool=solo", "-l", "info",
                                   "--without-mingle", "--without-gossip"], env=env, cwd=tmp_path, stdout=sink,
                                  stderr=subprocess.STDOUT)
        try:
            time.sleep(8)
            broker.kill9()
            time.sleep(3)
            broker.boot()
            deadline = time.time() + 60
            while time.time() < deadline and "looking for ladder queues" not in log.read_text():
                time.sleep(0.5)
            subprocess.run([sys.executable, "-c", "import rcnapp; rcnapp.mark.apply_async(('after',), countdown=2)"],
                           env=env, cwd=tmp_path, check=True, timeout=60)
            deadline = time.time() + 30
            while time.time() < deadline and not ran.exists():
                time.sleep(0.5)
        finally:
            worker.terminate()
            worker.wait(30)
    text = log.read_text()
    version = "4.3" if single.nodes[0].flavour.root else "3.10"
    if version == "3.10":
        assert "looking for ladder queues that hold messages" in text, text[-3000:]
    else:  # 4.3 recovers exchanges first: no look is needed, none is made
        assert "looking for ladder queues" not in text
    assert ran.exists() and ran.read_text().split() == ["after"], text[-3000:]
