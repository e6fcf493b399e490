"""The last hour of telemetry in numbers, for the web page's overview: lateness and throughput.

Reads the last hour's partitions under ``delayq_telemetry_dir`` (no Spark), where the web process can.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from .files import EventsNotFoundError, list_event_files

__all__ = ["LastHour", "last_hour"]

#: Bytes read at most (newest files first): the page must stay fast whatever the traffic.
READ_LIMIT = 64_000_000


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
    try:
        files = list_event_files(root, since=since)
    except (EventsNotFoundError, ValueError):
        return None
    out = LastHour(files=len(files))
    late: list[float] = []
    budget = READ_LIMIT
    for f in sorted(files, key=lambda f: f.mtime_ns, reverse=True):
        budget -= f.size
        if budget < 0:
            out.truncated = True
            break
        try:
            with open(f.path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    try:
                        e = json.loads(line)
                        ts = float(e.get("ts") or 0.0)
                    except (ValueError, TypeError, AttributeError):
                        continue  # a torn last line of a file being written
                    if not since <= ts <= now:
                        continue
                    kind = str(e.get("event"))
                    out.counts[kind] = out.counts.get(kind, 0) + 1
                    if kind == "delivered":
                        minute = min(59, int((ts - since) // 60))
                        out.per_minute[minute] += 1
                        if e.get("due_at") is not None:
                            late.append(max(0.0, ts - float(e["due_at"])))
        except OSError:
            continue
    if late:
        late.sort()
        out.lateness_p50_s = statistics.median(late)
        out.lateness_p95_s = late[min(len(late) - 1, int(0.95 * len(late)))]
        out.lateness_max_s = late[-1]
    return out
