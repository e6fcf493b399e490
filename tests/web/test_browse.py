"""Paging and filtering the waiting list, and the kept snapshot (pure: the reader is a plain function)."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery_delayq.pending.browse import Snapshot, WaitingFilter, page_of
from celery_delayq.index.query import PendingTask


def _task(i: int, *, attempt: int = 0, args: str | None = None) -> PendingTask:
    return PendingTask(f"id-{i:05d}", "proj.job", "", "q", "q", 1e10 + i, attempt, f"e{i}", args, "{}")


def test_filter_by_id_prefix_arguments_and_retries() -> None:
    t = _task(1, attempt=2, args="('Alice', 3)")
    assert WaitingFilter(id_prefix="id-0")(t) and not WaitingFilter(id_prefix="id-1")(t)
    assert WaitingFilter(text="alice")(t) and not WaitingFilter(text="bob")(t)
    assert WaitingFilter(retries_only=True)(t) and not WaitingFilter(retries_only=True)(_task(2))
    assert WaitingFilter(id_prefix="abc").describe() == "--id abc"


def test_snapshot_serves_the_kept_list_and_refreshes_in_the_background() -> None:
    reads: list[float] = []
    gate = threading.Event()

    def reader(app: Any, **_: Any) -> list[PendingTask]:
        if reads:
            gate.wait(5)  # a slow re-read: callers must not wait for it
        reads.append(time.monotonic())
        return [_task(i) for i in range(len(reads) * 10)]

    snap = Snapshot(None, ttl=0.0, reader=reader)
    first, _, _ = snap.get()
    assert len(first) == 10 and len(reads) == 1
    started = time.monotonic()
    again, _, _ = snap.get()  # stale: answered from the kept list at once, a re-read starts
    assert len(again) == 10 and time.monotonic() - started < 0.5
    snap.forget(["id-00003"])
    assert [t.task_id for t in snap.get()[0]].count("id-00003") == 0
    gate.set()
    deadline = time.monotonic() + 5
    while len(snap.get()[0]) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(snap.get()[0]) >= 20  # the re-read arrived (ttl 0: more may follow)


def test_callers_that_find_no_list_share_one_read() -> None:
    """`delayq web` starts a read in the background; the clicks that come before it ends wait for it instead
    of each reading the whole index again (at 100,000 waiting a read takes seconds)."""
    reads: list[int] = []

    def reader(app: Any, **_: Any) -> list[PendingTask]:
        reads.append(1)
        time.sleep(0.3)
        return [_task(i) for i in range(10)]

    snap = Snapshot(None, reader=reader)
    snap.forget(())  # what the CLI does at start
    clicks = [threading.Thread(target=snap.get) for _ in range(4)]
    for c in clicks:
        c.start()
    for c in clicks:
        c.join()
    assert len(reads) == 1 and len(snap.get()[0]) == 10


def test_many_callers_of_a_stale_list_start_one_read() -> None:
    reads: list[int] = []
    gate = threading.Event()

    def reader(app: Any, **_: Any) -> list[PendingTask]:
        reads.append(1)
        if len(reads) > 1:
            gate.wait(5)
        return [_task(i) for i in range(10)]

    snap = Snapshot(None, ttl=0.0, reader=reader)
    snap.get()
    barrier = threading.Barrier(16)

    def click() -> None:
        barrier.wait()
        snap.get()

    clicks = [threading.Thread(target=click) for _ in range(16)]
    for c in clicks:
        c.start()
    for c in clicks:
        c.join()
    time.sleep(0.2)
    assert len(reads) == 2  # the first read, and one background re-read for all sixteen
    gate.set()


def test_a_read_under_way_when_an_action_is_taken_does_not_bring_its_tasks_back() -> None:
    """A cancel while the background read runs: that read began before it and can still list the task; the
    page must not show it again (as fresh), and the index is read once more."""
    reads: list[int] = []
    started, go_on = threading.Event(), threading.Event()

    def reader(app: Any, **_: Any) -> list[PendingTask]:
        reads.append(1)
        if len(reads) == 2:
            started.set()
            go_on.wait(5)
        return [_task(i) for i in range(10)]

    snap = Snapshot(None, ttl=0.0, reader=reader)
    snap.get()
    snap.get()  # stale: the second read starts in the background
    assert started.wait(5)
    snap.forget(["id-00003"])  # the action, while that read runs
    go_on.set()
    deadline = time.monotonic() + 5
    while len(reads) < 3 and time.monotonic() < deadline:
        assert "id-00003" not in [t.task_id for t in snap.get()[0]]
        time.sleep(0.005)
    assert len(reads) >= 3  # read again after the action


def test_page_of_cuts_the_sorted_list(monkeypatch: Any) -> None:
    every = [_task(i) for i in range(120)]
    snap = Snapshot(None, reader=lambda app, **_: every)
    page = page_of(None, WaitingFilter(id_prefix="id-001"), offset=5, limit=3, snapshot=snap, now=0.0)
    assert page.total == 20 and [t.task_id for t in page.items] == ["id-00105", "id-00106", "id-00107"]


def test_a_whole_id_is_looked_up_as_urgent_and_a_page_is_not(monkeypatch: Any) -> None:
    """A lookup by whole id goes before the kept list's background read (which pauses: index/priority.py); a page
    cut from the kept list reads nothing and is not urgent."""
    from celery_delayq.index.priority import urgent_now
    from celery_delayq.pending import browse

    seen: list[int] = []

    whole = "0" * browse.FULL_ID_LENGTH

    def pending(app: Any, **kwargs: Any) -> list[PendingTask]:
        seen.append(urgent_now())
        return [PendingTask(whole, "proj.job", "", "q", "q", 1e10, 0)]

    monkeypatch.setattr(browse, "pending", pending)
    assert page_of(None, WaitingFilter(id_prefix=whole), now=0.0).total == 1
    assert seen == [1]
    page_of(None, WaitingFilter(id_prefix="id-0"), snapshot=Snapshot(None, reader=pending), now=0.0)
    assert seen == [1, 0] and urgent_now() == 0


def test_a_filter_called_on_a_task_applies_every_criterion():
    """``WaitingFilter(...)(task)`` is the whole filter: task glob, queue, due bounds and the rest."""
    t = PendingTask("id-1", "proj.job", "", "q", "q", 1000.0, 1, "e1", "('a',)", "{}", "TimeoutError: slow")
    assert WaitingFilter(task="proj.*", queue="q", due_after=1000.0, due_before=1000.5, retries_only=True,
                         error="Timeout*", text="'a'")(t)
    for miss in (dict(task="other.*"), dict(queue="elsewhere"), dict(due_before=1000.0), dict(due_after=1000.1),
                 dict(id_prefix="id-2"), dict(error="KeyError"), dict(text="zzz")):
        assert not WaitingFilter(**miss)(t), miss
