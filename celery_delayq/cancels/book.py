"""The cancelled task ids a worker knows, each until its entry expires (in memory, pure)."""

from __future__ import annotations

import threading
import time

__all__ = ["CancelBook"]


class CancelBook:
    """Task id -> epoch seconds until which the cancel holds; and the same for single ladder passes.

    A *pass* cancel (keyed to a pass's ``x-delayq-entry``) drops one copy of a
    task, the one a reschedule or a run-now replaced, and leaves the task id free
    for its new copy (:mod:`celery_delayq.cancels.supersede`).

    Filled by the worker's cancel-log follower thread and read by the
    worker's request path; a dict read or write is atomic in CPython, and
    the lock only serialises writers and pruning.
    """

    #: Prune expired entries after this many additions.
    PRUNE_EVERY = 1000

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._passes: dict[str, float] = {}
        self._lock = threading.Lock()
        self._added = 0

    def add(self, task_id: str, until: float) -> None:
        """Record a cancel of ``task_id``, holding until ``until`` (the later of two cancels wins)."""
        with self._lock:
            if until > self._until.get(task_id, 0.0):
                self._until[task_id] = until
            self._added += 1
            if self._added >= self.PRUNE_EVERY:
                self._added = 0
                self._prune(time.time())

    def add_pass(self, entry: str, until: float) -> None:
        """Record that the ladder pass ``entry`` (one copy of a task) must not run, until ``until``."""
        with self._lock:
            if until > self._passes.get(entry, 0.0):
                self._passes[entry] = until

    def pass_cancelled(self, entry: str | None, now: float | None = None) -> bool:
        """Is the ladder pass ``entry`` cancelled at ``now``?"""
        until = self._passes.get(entry) if entry else None
        return until is not None and until > (time.time() if now is None else now)

    def live_passes(self, now: float | None = None) -> set[str]:
        """Every pass entry cancelled at ``now``."""
        now = time.time() if now is None else now
        return {entry for entry, until in list(self._passes.items()) if until > now}

    def cancelled(self, task_id: str, now: float | None = None) -> bool:
        """Is ``task_id`` cancelled at ``now``?"""
        until = self._until.get(task_id)
        return until is not None and until > (time.time() if now is None else now)

    def live(self, now: float | None = None) -> set[str]:
        """Every id cancelled at ``now``."""
        now = time.time() if now is None else now
        return {task_id for task_id, until in list(self._until.items()) if until > now}

    def __len__(self) -> int:
        return len(self._until)

    def _prune(self, now: float) -> None:
        for task_id in [t for t, until in self._until.items() if until <= now]:
            del self._until[task_id]
        for entry in [e for e, until in self._passes.items() if until <= now]:
            del self._passes[entry]
