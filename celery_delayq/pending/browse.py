"""A page of the waiting tasks, filtered: what the web page and the API ask of the index.

:class:`WaitingFilter` adds what an operator searches by to :func:`~celery_delayq.pending.pending`'s filters
and :func:`page_of` cuts the sorted list; a full task id reads its index shard alone, anything else the whole
index, which :class:`Snapshot` keeps for a few seconds while pages poll.
"""

from __future__ import annotations

import bisect
import contextlib
import fnmatch
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from .listing import _matches, pending
from ..error_groups import message_matches, split_error
from ..index.priority import urgent
from ..index.query import PendingTask
from ..typing import CeleryApp

__all__ = ["WaitingFilter", "Page", "Snapshot", "page_of", "matching", "FULL_ID_LENGTH"]

#: An id prefix this long (a UUID's 36 characters) is taken as a whole id: one shard is read.
FULL_ID_LENGTH = 36


@dataclass(frozen=True)
class WaitingFilter:
    """Which waiting tasks to show; every criterion given must match.

    Attributes:
        task: Glob on the task name.
        queue: Destination queue (or routing key).
        id_prefix: Task ids starting with this (a whole id reads one index shard).
        text: Substring of the arguments (Celery's ``argsrepr``/``kwargsrepr``), case-insensitive.
        due_after: Due at or after (epoch seconds).
        due_before: Due before (epoch seconds).
        retries_only: Only retries (attempt 1 or more).
        error: Glob on a retry's last exception type (``TimeoutError``, ``*Error``).
        message: A retry's last error message: its pattern as grouped
            (:func:`~celery_delayq.error_groups.message_pattern`), or text in it.
    """

    task: str | None = None
    queue: str | None = None
    id_prefix: str | None = None
    text: str | None = None
    due_after: float | None = None
    due_before: float | None = None
    retries_only: bool = False
    error: str | None = None
    message: str | None = None

    def __call__(self, t: PendingTask) -> bool:
        if not _matches(t, self.task, self.queue, self.due_before, self.due_after):
            return False
        if self.id_prefix and not t.task_id.startswith(self.id_prefix):
            return False
        if self.retries_only and t.attempt < 1:
            return False
        if self.error or self.message:
            kind, message = split_error(t.last_error)
            if self.error and not fnmatch.fnmatchcase(kind, self.error):
                return False
            if self.message and not message_matches(message, self.message):
                return False
        return not self.text or self.text.lower() in t.arguments.lower()

    def describe(self) -> str:
        """The filter in words, for "no waiting task matches ..." (``""`` when there is none)."""
        parts = [f"{name} {value}" for name, value in (
            ("--task", self.task), ("--queue", self.queue), ("--id", self.id_prefix), ("--args", self.text),
            ("--due-after", self.due_after), ("--due-before", self.due_before), ("--error", self.error),
            ("--message", self.message)) if value]
        if self.retries_only:
            parts.append("--retries")
        return " ".join(parts)


@dataclass(frozen=True)
class Page:
    """One page of waiting tasks, soonest due first."""

    items: list[PendingTask]
    total: int
    offset: int
    limit: int
    read_s: float
    #: Seconds since the index was read (a :class:`Snapshot` may reuse a recent read).
    age_s: float = 0.0


class Snapshot:
    """The whole waiting list, kept for paging: a page must not re-read 100,000 entries per click.

    The first :meth:`get` reads the index (and the cancel log) and waits for
    it. Later calls answer at once from the last read; when it is older than
    ``ttl`` seconds a new read starts in a background thread (one at a time)
    and the next call gets it: stale while it revalidates, and the page says
    how old its list is. :meth:`forget` drops tasks an action has just
    cancelled or moved, and starts a new read.

    However many callers ask at once, the index is read once: callers that find
    no list wait for the read under way instead of starting their own, and a
    second background read is not started while one is queued or running. A
    read that was under way when an action was taken can still list what the
    action removed: those tasks are dropped from it too, and the index is read
    once more (the list is then as of a read that began after the action).
    """

    def __init__(self, app: CeleryApp, ttl: float = 5.0, *, reader: Callable[..., list[PendingTask]] = pending) -> None:
        self.app = app
        self.ttl = ttl
        self._reader = reader
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._taken: float = 0.0
        self._read_s: float = 0.0
        self._items: list[PendingTask] | None = None
        self._refreshing = False  # a background read is queued or running
        self._gone: set[str] | None = None  # forgotten while the read under way ran (None: no action since it began)
        self.error: BaseException | None = None

    def invalidate(self) -> None:
        """Forget the read entirely: the next :meth:`get` reads again and waits."""
        with self._lock:
            self._items, self._taken = None, 0.0

    def forget(self, task_ids: Iterable[str]) -> None:
        """Drop these tasks from the kept list now, and read the index again in the background."""
        gone = set(task_ids)
        with self._lock:
            if self._items is not None:
                self._items = [t for t in self._items if t.task_id not in gone]
            self._taken = 0.0 if self._items is None else self._taken - self.ttl - 1
            self._gone = gone if self._gone is None else self._gone | gone
        self._refresh_in_background()

    def get(self, now: float | None = None) -> tuple[list[PendingTask], float, float]:
        """``(every waiting task, seconds the read took, age of the read in seconds)``."""
        with self._lock:
            items, taken, read_s = self._items, self._taken, self._read_s
        if items is None:
            self._read(unless_kept=True)  # the first read: nothing to show before it (or the one under way)
            with self._lock:
                items, taken, read_s = self._items or [], self._taken, self._read_s
        age = time.monotonic() - taken
        if age > self.ttl:
            self._refresh_in_background()
        return items, read_s, max(0.0, age)

    def _read(self, *, unless_kept: bool = False) -> None:
        with self._reading:
            while True:
                with self._lock:
                    if unless_kept and self._items is not None:
                        return  # another caller's read (this one waited for it) gave a list
                    self._gone = set()  # an action from now on: this read may still list what it removed
                started = time.monotonic()
                items = self._reader(self.app)
                with self._lock:
                    gone = self._gone or set()
                    again = bool(gone)
                    if again:
                        items = [t for t in items if t.task_id not in gone]
                    self._items, self._taken, self._read_s = items, time.monotonic(), time.monotonic() - started
                    self._gone, self.error = None, None
                if not again:
                    return
                unless_kept = False  # read once more: the action's own effects are in the index now

    def _refresh_in_background(self) -> None:
        with self._lock:
            if self._refreshing or self._reading.locked():
                return
            self._refreshing = True

        def run() -> None:
            try:
                self._read()
            except Exception as exc:  # noqa: BLE001 - kept for the page to show; the old list stays
                self.error = exc
            finally:
                with self._lock:
                    self._refreshing = False
        threading.Thread(target=run, name="delayq-web-index", daemon=True).start()


def matching(app: CeleryApp, match: WaitingFilter, *, snapshot: Snapshot | None = None,
             now: float | None = None) -> Page:
    """Every task that ``match``, soonest due first (a :class:`Page` of them all: ``limit`` is their count)."""
    now = time.time() if now is None else now
    started = time.monotonic()
    whole_id = len(match.id_prefix or "") >= FULL_ID_LENGTH
    if snapshot is not None and not whole_id:
        every, read_s, age = snapshot.get()
    else:  # a lookup is urgent: a background read of the whole index pauses meanwhile
        with urgent() if whole_id else contextlib.nullcontext():
            every = pending(app, task_id=match.id_prefix if whole_id else None, now=now)
        read_s, age = time.monotonic() - started, 0.0
    first = bisect.bisect_right(every, now, key=lambda t: t.due)  # sorted by due: skip what fell due since
    if match == WaitingFilter():  # no filter: a slice, not a pass over 100,000 tasks
        found = every[first:]
    else:
        found = [t for t in every[first:] if match(t)]
    return Page(found, len(found), 0, len(found), read_s, age)


def page_of(app: CeleryApp, match: WaitingFilter, *, offset: int = 0, limit: int = 50,
            snapshot: Snapshot | None = None, now: float | None = None) -> Page:
    """The tasks that ``match``, soonest due first, from ``offset``, at most ``limit``."""
    every = matching(app, match, snapshot=snapshot, now=now)
    return replace(every, items=every.items[offset:offset + limit], offset=offset, limit=limit)
