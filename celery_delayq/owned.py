"""A broker connection owned by one process, with its confirm channel; safe across ``fork()``.

The ladder publisher and the parker each keep a dedicated confirm-mode
connection. After a fork the child must not touch the parent's socket nor
inherit a lock that was held, so both drop them and reconnect on next use.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable

import kombu

from .confirms import ConfirmChannel

__all__ = ["OwnsConnection"]


class OwnsConnection:
    """Mixin: ``_conn``/``_confirm`` belong to the process whose pid is ``_pid``."""

    #: Lock type the owner serialises its channel with (a publisher re-enters its own lock).
    _lock_type: Callable[[], Any] = threading.Lock
    _conn: kombu.Connection | None = None
    _confirm: ConfirmChannel | None = None
    _pid: int = 0

    def _drop(self) -> None:
        """Release the connection if this process opened it; forget it either way."""
        if self._conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._conn.release()
        self._conn = None
        self._confirm = None

    def after_fork_in_child(self) -> None:
        """In a forked child: never touch the parent's socket; reconnect on next use."""
        self._lock = self._lock_type()
        self._conn = None
        self._confirm = None
