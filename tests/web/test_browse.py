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


def test_page_of_cuts_the_sorted_list(monkeypatch: Any) -> None:
    every = [_task(i) for i in range(120)]
    snap = Snapshot(None, reader=lambda app, **_: every)
    page = page_of(None, WaitingFilter(id_prefix="id-001"), offset=5, limit=3, snapshot=snap, now=0.0)
    assert page.total == 20 and [t.task_id for t in page.items] == ["id-00105", "id-00106", "id-00107"]
