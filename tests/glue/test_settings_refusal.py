"""A worker whose ``delayq_*`` settings cannot be used does not start: one line, exit 78, no traceback.

Before, ``delayq_enabled = "yes please"`` was read as on in one place and
raised inside a Celery signal in another, which Celery logs as a traceback and
carries on: the worker consumed with classic ETA, holding delayed tasks in memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROJ = textwrap.dedent("""
    import os
    from celery import Celery
    import celery_delayq  # noqa: F401  (the worker's CLI plugin loads it too)

    app = Celery("proj", broker=os.environ["BROKER"])
    app.conf.update(delayq_enabled=os.environ["ENABLED"], delayq_prefix=os.environ["PREFIX"],
                    task_default_queue=os.environ["QUEUE"])
""")


def _worker(tmp_path: Path, broker_url: str, prefix: str, uid: str, enabled: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "proj.py").write_text(PROJ)
    env = dict(os.environ, BROKER=broker_url, PREFIX=prefix, QUEUE=f"sr.{uid}", ENABLED=enabled,
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "celery", "-A", "proj", "worker", "-P", "solo", "-l", "info",
                           "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"sr{uid}@%h"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)


def test_a_worker_with_an_unusable_enabled_setting_refuses_to_start(
        tmp_path: Path, broker_url: str, prefix: str, uid: str) -> None:
    done = _worker(tmp_path, broker_url, prefix, uid, "yes please")
    out = done.stdout + done.stderr
    assert done.returncode == 78, out
    refusal = [line for line in done.stderr.splitlines() if "the worker will not start" in line]
    assert len(refusal) == 1, out
    assert "delayq_enabled" in refusal[0] and "yes please" in refusal[0] and "true/false" in refusal[0]
    assert "Traceback" not in out
    assert "ready." not in out
