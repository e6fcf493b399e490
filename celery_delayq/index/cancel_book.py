"""The cancelled task ids a worker knows, each until its entry expires (in memory, pure).

The book also knows when the entry carrying each cancel was written, so a worker can tell which cancels outlive
their entry on the broker (the cancel log keeps an entry for its retention only, :mod:`.cancel_log`) and write
them again in time (:meth:`CancelBook.renewals`).
"""

from __future__ import annotations

import threading
import time

__all__ = ["CancelBook"]


class CancelBook:
    """Task id -> epoch seconds until which the cancel holds; and the same for single ladder passes.

    A *pass* cancel (keyed to a pass's ``x-delayq-entry``) drops one copy of a task, the one a reschedule or a
    run-now replaced, and leaves the task id free for its new copy (:mod:`celery_delayq.cancels.reschedule`).

    Filled by the worker's cancel-log follower thread and read by the worker's request path; a dict read or
    write is atomic in CPython, and the lock only serialises writers and pruning.
    """

    #: Prune expired entries after this many additions.
    PRUNE_EVERY = 1000

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        #: When the entry that set ``_until`` was written (0: not known, an entry of an older version).
        self._written: dict[str, float] = {}
        #: The task's due time, when the cancel found it waiting (``delayq status`` counts those still due).
        self._due: dict[str, float] = {}
        #: Cancelled ladder passes (``x-delayq-entry``) and until when (:mod:`celery_delayq.cancels.reschedule`).
        self._passes: dict[str, float] = {}
        self._lock = threading.Lock()
        self._added = 0

    def add(self, task_id: str, until: float, written: float = 0.0, due: float | None = None) -> None:
        """Record a cancel of ``task_id``, holding until ``until`` (the later of two cancels wins).

        ``written`` is when its log entry was written (0 when not known);
        ``due`` the task's due time when the cancel found it waiting.
        """
        with self._lock:
            if due is not None:
                self._due[task_id] = due
            current = self._until.get(task_id, 0.0)
            if until > current:
                self._until[task_id] = until
                self._written[task_id] = written
            elif until == current:  # the same cancel written again (a renewal): the newer entry counts
                self._written[task_id] = max(written, self._written.get(task_id, 0.0))
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

    def cancelled(self, task_id: str, now: float | None = None) -> bool:
        """Is ``task_id`` cancelled at ``now``?"""
        until = self._until.get(task_id)
        return until is not None and until > (time.time() if now is None else now)

    def live(self, now: float | None = None) -> set[str]:
        """Every id cancelled at ``now``."""
        now = time.time() if now is None else now
        return {task_id for task_id, until in list(self._until.items()) if until > now}

    def still_due(self, now: float | None = None) -> set[str]:
        """The cancelled ids whose task was found waiting and is not due yet: still in the ladder's queues."""
        now = time.time() if now is None else now
        return {task_id for task_id, due in list(self._due.items()) if due > now and self.cancelled(task_id, now)}

    def due(self, task_id: str) -> float | None:
        """The due time the cancel of ``task_id`` found, if it found the task waiting."""
        return self._due.get(task_id)

    def renewals(self, keep_s: float, now: float | None = None) -> list[tuple[str, float]]:
        """``(task_id, until)`` of the cancels to write again now, so that they outlive their entries.

        An entry is kept on the broker for at least ``keep_s`` after it was written. A cancel that must hold
        longer than that is due for renewal once half of ``keep_s`` has passed, so a worker that runs at any
        time in the second half renews it before its entry can go.
        """
        now = time.time() if now is None else now
        out = []
        for task_id, until in list(self._until.items()):
            written = self._written.get(task_id, 0.0)
            if until > now and until > written + keep_s and now >= written + keep_s / 2:
                out.append((task_id, until))
        return sorted(out)

    def __len__(self) -> int:
        return len(self._until)

    def _prune(self, now: float) -> None:
        for task_id in [t for t, until in self._until.items() if until <= now]:
            del self._until[task_id]
            self._written.pop(task_id, None)
            self._due.pop(task_id, None)
        for entry in [e for e, until in self._passes.items() if until <= now]:
            del self._passes[entry]
