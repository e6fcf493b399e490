"""The test sessions' own hygiene: a killed session's vhost is deleted by the next session, a live one's is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from vhost_hygiene import delete_stale_session_vhosts


def _vhosts() -> set[str]:
    return set(subprocess.run(["rabbitmqctl", "-q", "list_vhosts", "name"], check=True, capture_output=True,
                              text=True, timeout=60).stdout.split())


def test_a_dead_sessions_vhost_is_deleted_and_a_live_ones_kept(vhost: str) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = f"delayq-test-{int(gone.stdout)}-{uuid.uuid4().hex[:8]}"
    alive = f"delayq-test-{os.getppid()}-{uuid.uuid4().hex[:8]}"  # pytest's parent: alive while this runs
    for name in (dead, alive):
        subprocess.run(["rabbitmqctl", "-q", "add_vhost", name], check=True, capture_output=True, timeout=60)
    try:
        deleted = delete_stale_session_vhosts()
        assert dead in deleted and dead not in _vhosts()
        assert alive not in deleted and alive in _vhosts()
        assert vhost in _vhosts()  # this session's own
    finally:
        for name in (dead, alive):
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], capture_output=True, timeout=60)
