"""``examples/demo.py`` end to end, as ``./dev demo`` runs it: a real worker, the real ladder, then a clean broker.

The demo declares a ladder (62 queues, 58 exchanges) and a task queue on the
broker it is pointed at; a newcomer's broker must not keep them unless they
ask (``--keep``), and then one printed command removes them. Run against
this session's own vhost.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import management_url


pytestmark = pytest.mark.timeout(180)

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def _demo(broker_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DELAYQ_DEMO_BROKER=broker_url, DELAYQ_DEMO_MANAGEMENT_URL=management_url())
    out = subprocess.run([sys.executable, str(DEMO), *args], env=env, capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _demo_names(vhost: str) -> set[str]:
    """``queue NAME`` / ``exchange NAME`` of everything in the vhost named like the demo's (rabbitmqctl)."""
    names = set()
    for kind in ("queue", "exchange"):
        listed = subprocess.run(["rabbitmqctl", "-q", f"list_{kind}s", "-p", vhost, "name", "--no-table-headers"],
                                check=True, capture_output=True, text=True, timeout=60).stdout
        names.update(f"{kind} {line.strip()}" for line in listed.splitlines()
                     if line.strip().startswith(("delayq_demo", "delayq-demo")))
    return names


def test_demo_runs_and_leaves_nothing_behind(broker_url: str, vhost: str) -> None:
    assert not _demo_names(vhost)
    out = _demo(broker_url)
    assert "attempt 3:" in out.stdout and "order 42 charged" in out.stdout
    assert "deleted ladder 'delayq_demo'" in out.stdout and "62 queues" in out.stdout
    said = (out.stdout + out.stderr).count("delayq audit: who=cli:")
    assert said == 1, out.stderr  # the cleanup's audit line, printed once beside the demo's own logging
    assert not _demo_names(vhost)


def test_keep_leaves_the_ladder_and_says_how_to_remove_it(broker_url: str, vhost: str) -> None:
    out = _demo(broker_url, "--keep")
    try:
        kept = _demo_names(vhost)
        assert "queue delayq-demo" in kept and "queue delayq_demo.14x4.L00.d1" in kept
        assert len([n for n in kept if n.startswith("queue ")]) == 63  # the ladder's 62 and the task queue
        command = out.stdout.strip().splitlines()[-1].strip()
        assert command.endswith("examples/demo.py --clean"), out.stdout
    finally:
        cleaned = _demo(broker_url, "--clean")
    assert "deleted ladder 'delayq_demo'" in cleaned.stdout
    assert not _demo_names(vhost)
