"""The last hour of telemetry in numbers, for the web page's overview: lateness and throughput.

Reads the last hour's partitions under ``delayq_telemetry_dir`` through :func:`~.series.read_window`
(shared with the charts' :mod:`.series`; no Spark), where the web process can.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from .series import READ_LIMIT, lateness, read_window

__all__ = ["LastHour", "last_hour", "READ_LIMIT"]


@dataclass
class LastHour:
    """Counts per event, lateness of deliveries, and deliveries per minute (oldest minute first)."""

    counts: dict[str, int] = field(default_factory=dict)
    lateness_p50_s: float | None = None
    lateness_p95_s: float | None = None
    lateness_max_s: float | None = None
    per_minute: list[int] = field(default_factory=lambda: [0] * 60)
    files: int = 0
    truncated: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the API's ``/api/overview``)."""
        return {"counts": self.counts, "lateness_p50_s": self.lateness_p50_s, "lateness_p95_s": self.lateness_p95_s,
                "lateness_max_s": self.lateness_max_s, "delivered_per_minute": self.per_minute,
                "files": self.files, "truncated": self.truncated}


def last_hour(root: str, *, now: float | None = None) -> LastHour | None:
    """The last hour under ``root``; None when there is no such directory."""

    now = time.time() if now is None else now
    since = now - 3600.0
    window = read_window(root, since, now)
    if window is None:
        return None
    out = LastHour()
    late: list[float] = []
    for kind, ts, e in window:
        out.counts[kind] = out.counts.get(kind, 0) + 1
        if kind == "delivered":
            minute = min(59, int((ts - since) // 60))
            out.per_minute[minute] += 1
            if (how_late := lateness(e, ts)) is not None:
                late.append(how_late)
    out.files, out.truncated = window.files, window.truncated
    if late:
        late.sort()
        out.lateness_p50_s = statistics.median(late)
        out.lateness_p95_s = late[min(len(late) - 1, int(0.95 * len(late)))]
        out.lateness_max_s = late[-1]
    return out
