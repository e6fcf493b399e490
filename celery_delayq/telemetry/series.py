"""Telemetry over a window (1 h, 24 h, 7 d) in time buckets, for the web page's charts.

Reads the recorder's JSON Lines files under ``delayq_telemetry_dir`` (only the window's partitions; no Spark):
per bucket, the :data:`COUNTED` events and the deliveries' lateness (``ts - due_at``) at p50 and p99.
:func:`read_window` is the one reader, shared with :func:`~.lasthour.last_hour`. Nothing here writes.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from .files import EventsNotFoundError, list_event_files

__all__ = ["WINDOWS", "COUNTED", "Series", "series", "read_window", "Window", "READ_LIMIT", "quantile"]

#: Bytes read at most (newest files first): the page must stay fast whatever the traffic.
READ_LIMIT = 64_000_000
#: A window's name: (its length, one bucket), in seconds.
WINDOWS: dict[str, tuple[int, int]] = {"1h": (3600, 60), "24h": (86400, 900), "7d": (7 * 86400, 3600)}
#: The events counted per bucket.
COUNTED = ("scheduled", "delivered", "retried", "parked")


@dataclass
class Window:
    """The events of ``[since, until]`` under a telemetry directory: iterate for ``(event, ts, record)``.

    ``files`` is how many files the window spans; ``truncated`` is set when the newest
    :data:`READ_LIMIT` bytes did not hold them all (the oldest are left out).
    """

    root: str
    since: float
    until: float
    read_limit: int = READ_LIMIT
    files: int = 0
    truncated: bool = False

    def __iter__(self) -> Iterator[tuple[str, float, dict[str, Any]]]:
        found = list_event_files(self.root, since=self.since, until=self.until + 1)
        self.files = len(found)
        budget = self.read_limit
        for f in sorted(found, key=lambda f: f.mtime_ns, reverse=True):
            budget -= f.size
            if budget < 0:
                self.truncated = True
                return
            try:
                with open(f.path, encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        try:
                            e = json.loads(line)
                            ts = float(e.get("ts") or 0.0)
                        except (ValueError, TypeError, AttributeError):
                            continue  # a torn last line of a file being written
                        if self.since <= ts <= self.until:
                            yield str(e.get("event")), ts, e
            except OSError:
                continue


def read_window(root: str, since: float, until: float) -> Window | None:
    """The events of ``[since, until]`` under ``root``; None when there is no such local directory."""
    try:
        list_event_files(root, since=since, until=until + 1)
    except (EventsNotFoundError, ValueError):
        return None
    return Window(root, since, until)


def lateness(e: dict[str, Any], ts: float) -> float | None:
    """How late a ``delivered`` event reached its worker (never negative), or None without ``due_at``."""
    due = e.get("due_at")
    try:
        return None if due is None else max(0.0, ts - float(due))
    except (TypeError, ValueError):
        return None


def quantile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of a sorted list (None when empty)."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Series:
    """Counts and lateness per bucket, oldest bucket first; ``t`` is each bucket's start (epoch seconds)."""

    window: str
    step_s: int
    t: list[float]
    counts: dict[str, list[int]]
    lateness_p50_s: list[float | None]
    lateness_p99_s: list[float | None]
    files: int = 0
    truncated: bool = False
    generated_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the API's ``/api/series``): every field, by name."""
        return asdict(self)


def series(root: str, window: str = "1h", *, now: float | None = None) -> Series | None:
    """The window's buckets under ``root`` (ending at ``now``); None when there is no such directory.

    Raises:
        KeyError: a window not in :data:`WINDOWS`.
    """
    length, step = WINDOWS[window]
    now = time.time() if now is None else now
    end = (math.floor(now / step) + 1) * step  # the bucket holding now is the last one
    buckets = length // step
    start = end - buckets * step
    found = read_window(root, start, now)
    if found is None:
        return None
    counts = {kind: [0] * buckets for kind in COUNTED}
    late: list[list[float]] = [[] for _ in range(buckets)]
    for kind, ts, e in found:
        i = min(buckets - 1, int((ts - start) // step))
        if kind in counts:
            counts[kind][i] += 1
        if kind == "delivered" and (how_late := lateness(e, ts)) is not None:
            late[i].append(how_late)
    for values in late:
        values.sort()
    return Series(window=window, step_s=step, t=[float(start + i * step) for i in range(buckets)], counts=counts,
                  lateness_p50_s=[quantile(v, 0.5) for v in late], lateness_p99_s=[quantile(v, 0.99) for v in late],
                  files=found.files, truncated=found.truncated, generated_at=now)
