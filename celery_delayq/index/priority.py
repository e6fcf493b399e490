"""Reads a person waits for go first: a whole-index read pauses while a lookup of this process runs.

A lookup runs in :func:`urgent`; a whole-index read calls its :class:`Pause` between two socket reads and waits
while an urgent read runs, at most :data:`MAX_PAUSE_S` per read. Process-wide and in memory; a child reading on
this process's behalf follows it (:func:`mirror`). Measured why: docs/how-it-works.md, "The index of waiting tasks".
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from typing import Any, Callable, Iterator

__all__ = ["urgent", "Pause", "MAX_PAUSE_S", "urgent_now", "mirror"]

#: The most one read of the whole index pauses for lookups, in seconds (wall time, over the whole read).
MAX_PAUSE_S = 1.5

_cond = threading.Condition()
_urgent = 0  # urgent blocks under way in this process
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("delayq_urgent_read", default=False)
_mirrors: list[Any] = []  # shared counters (multiprocessing RawValue) kept equal to _urgent


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """Reads in this block go before this process's whole-index reads (those pause until it ends)."""
    global _urgent
    if _inside.get():  # nested: counted once
        yield
        return
    token = _inside.set(True)
    with _cond:
        _urgent += 1
        _publish()
    try:
        yield
    finally:
        with _cond:
            _urgent -= 1
            _publish()
            if not _urgent:
                _cond.notify_all()
        _inside.reset(token)


def _publish() -> None:
    for counter in _mirrors:
        counter.value = _urgent


def mirror(counter: Any) -> Callable[[], None]:
    """Keep ``counter.value`` (a shared integer) equal to this process's count of urgent blocks, so that a
    child process's whole-index reads pause for them too; returns the function that stops it."""
    with _cond:
        _mirrors.append(counter)
        counter.value = _urgent

    def stop() -> None:
        with _cond:
            if any(c is counter for c in _mirrors):
                _mirrors[:] = [c for c in _mirrors if c is not counter]
    return stop


def urgent_now() -> int:
    """How many urgent blocks are under way in this process."""
    return _urgent


class Pause:
    """What one bulk read's shard readers call between two socket reads: wait while an urgent read runs.

    One per read of the whole index, shared by its shard readers. Made in the thread that starts the
    read (a read begun inside :func:`urgent` never waits; the pool threads that read the shards do not
    inherit the block's context, so it is taken here). ``budget``: the most the read waits in all, in
    seconds of wall time while any of its readers waits (default :data:`MAX_PAUSE_S`).
    """

    def __init__(self, budget: float | None = None) -> None:
        self.budget = 0.0 if _inside.get() else MAX_PAUSE_S if budget is None else budget
        #: Seconds of wall time at least one reader of this read has waited so far.
        self.waited = 0.0
        self._waiting = 0
        self._since = 0.0

    def _spent(self, now: float) -> float:
        return self.waited + (now - self._since if self._waiting else 0.0)

    def __call__(self) -> None:
        if not _urgent or self.waited >= self.budget:  # the usual case: two unlocked reads
            return
        with _cond:
            if not self._waiting:
                self._since = time.monotonic()
            self._waiting += 1
            try:
                while _urgent and (remaining := self.budget - self._spent(time.monotonic())) > 0:
                    _cond.wait(remaining)
            finally:
                self._waiting -= 1
                if not self._waiting:
                    self.waited += time.monotonic() - self._since
