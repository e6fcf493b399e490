"""Live pages at 100,000 waiting, simulated without a broker (``benchmarks/results/web-live.md``).

The kept waiting list is re-read in the background while pages poll ``/api/changes``. Does a click still
answer fast? The index read is simulated as ``web_scale`` measured it on this host: 3.1 s of stream I/O
(a sleep: the GIL is free, as it is while the broker sends), then 100,000 ``PendingTask`` built in Python.
Three pollers call :meth:`~celery_delayq.web.live.Live.changes` five times a second (far more than pages
do); meanwhile the first page (a slice of the kept list) and an argument search (a pass over it) are
timed every 0.25 s for ``--seconds``. Also timed: the digest of a 100,000-task list and a cached signal.

Run: ``.venv/bin/python -m benchmarks.web_live [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

from benchmarks.common import RESULTS_DIR
from celery_delayq.index.query import PendingTask
from celery_delayq.pending.browse import Snapshot, WaitingFilter, page_of
from celery_delayq.web.live import Live

N = 100_000
IO_S = 3.1  # read_index over 16 shards, median, benchmarks/results/web.md


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    ids = [str(uuid.uuid4()) for _ in range(N)]

    def reader(_app: Any) -> list[PendingTask]:
        time.sleep(IO_S)
        base = time.time() + 600
        return [PendingTask(i, "proj.job", "", "q", "q", base + n, 0, "e", f"({n},)", "{}", None)
                for n, i in enumerate(ids)]

    snap = Snapshot(None, reader=reader)
    live = Live(SimpleNamespace(snapshot=snap))  # type: ignore[arg-type]
    live._parked_count = lambda: 0  # type: ignore[method-assign]
    started = time.monotonic()
    snap.get()
    first_read = time.monotonic() - started
    digests = []
    for _ in range(5):
        live._digest = (None, "")
        t = time.perf_counter()
        live._list_digest(snap.get()[0])
        digests.append(time.perf_counter() - t)
    live.changes()
    t = time.perf_counter()
    for _ in range(1000):
        live.changes()
    cached_us = (time.perf_counter() - t) / 1000 * 1e6

    stop = threading.Event()
    ages: list[float] = []

    def poller() -> None:
        while not stop.is_set():
            sig = live.changes()
            if sig.read_at is not None:
                ages.append(sig.now - sig.read_at)
            time.sleep(0.2)

    pollers = [threading.Thread(target=poller) for _ in range(3)]
    for p in pollers:
        p.start()
    first: list[float] = []
    search: list[float] = []
    end = time.time() + args.seconds
    while time.time() < end:
        t = time.perf_counter()
        page_of(None, WaitingFilter(), snapshot=snap)  # type: ignore[arg-type]
        first.append(time.perf_counter() - t)
        t = time.perf_counter()
        page_of(None, WaitingFilter(text="(99999,)"), snapshot=snap)  # type: ignore[arg-type]
        search.append(time.perf_counter() - t)
        time.sleep(0.25)
    stop.set()
    for p in pollers:
        p.join()
    load = os.getloadavg()[0]
    rows = [
        ("first page (slice of the kept list), ms", [v * 1000 for v in first]),
        ("argument search (one match in 100,000), ms", [v * 1000 for v in search]),
        ("age of the signal's list, s", ages),
    ]
    lines = [
        "# Live pages at 100,000 waiting (simulated index read)", "",
        f"Python {platform.python_version()}, 1-min load {load:.1f} at the end, {args.seconds:.0f} s of polling; "
        f"the index read simulated as {IO_S} s of I/O plus building {N:,} tasks (first read {first_read:.2f} s).",
        "Command: `.venv/bin/python -m benchmarks.web_live`.", "",
        "| what | n | median | p95 | max |", "|---|---:|---:|---:|---:|",
    ]
    for name, values in rows:
        lines.append(f"| {name} | {len(values)} | {statistics.median(values):.1f} | {_quantile(values, .95):.1f} | "
                     f"{max(values):.1f} |")
    lines += ["", f"* Digest of a 100,000-task list (once per read): median {statistics.median(digests):.3f} s.",
              f"* A cached signal (within its second): {cached_us:.1f} µs per call.",
              f"* The snapshot's ttl after the reads: {snap.ttl:.2f} s (as long as a read takes: reading never takes "
              "more than half the time)."]
    out = RESULTS_DIR / "web-live.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
