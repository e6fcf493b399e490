"""Test sessions' broker hygiene: the vhosts a killed session left behind are deleted by the next one."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess

__all__ = ["delete_stale_session_vhosts"]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_stale_session_vhosts() -> list[str]:
    """Delete the vhosts of test sessions that were killed before their cleanup ran.

    A session's vhost is named ``delayq-test-<pid>-<random>``; one whose pytest process is gone
    and that has no connection left is stale (its ladders hold file handles on a 3.x broker).
    Sessions running beside this one are alive and keep theirs. Returns the names deleted.
    """
    try:
        listed = subprocess.run(["rabbitmqctl", "-q", "list_vhosts", "name"], check=True, capture_output=True,
                                text=True, timeout=60).stdout.split()
        in_use = set(subprocess.run(["rabbitmqctl", "-q", "list_connections", "vhost"], check=True,
                                    capture_output=True, text=True, timeout=60).stdout.split())
    except Exception:  # noqa: BLE001 - a tidy-up: the session goes on without it
        return []
    deleted = []
    for name in listed:
        m = re.fullmatch(r"delayq-test-(\d+)-[0-9a-f]{8}", name)
        if m and name not in in_use and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(Exception):
                subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], check=True, capture_output=True,
                               timeout=60)
                deleted.append(name)
    return deleted
