"""Retry storms: minutes in which a task's retries jump far above its own normal.

Pure Python over the small ``retries_per_minute`` table (no Spark), so the rule is easy to read, test and tune:
:func:`find_storms` has it, docs/report.md ("Definitions") says it in words.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RetryStorm", "find_storms"]


@dataclass(frozen=True)
class RetryStorm:
    """One storm of one task."""

    task_name: str
    #: Epoch seconds of the first stormy minute's start, and of the last one's end.
    start_s: int
    end_s: int
    #: Highest retries in one minute during the storm.
    peak_per_minute: int
    #: The task's normal retries per minute before the storm (median of its last calm minutes).
    baseline_per_minute: float
    #: Retries during the storm, all minutes from start to end.
    retries: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``summary.json``)."""
        return asdict(self)


def find_storms(rows: Iterable[Mapping[str, Any]], *, factor: float = 4.0, min_retries: int = 10, window: int = 15,
                gap: int = 2, warmup: int = 15) -> list[RetryStorm]:
    """The retry storms in ``retries_per_minute`` rows (``task_name``, ``minute_s``, ``retries``).

    A minute is stormy when its retries reach ``max(min_retries, factor * baseline)``, the baseline being the
    median of the task's last ``window`` calm minutes (silent minutes count as 0), frozen while a storm lasts;
    the first ``warmup`` minutes only learn it; stormy minutes at most ``gap`` apart are one storm. Sorted by
    start time, then task name.
    """
    series: dict[str, dict[int, int]] = defaultdict(dict)
    for row in rows:
        minute = int(row["minute_s"]) // 60
        per_task = series[row["task_name"]]
        per_task[minute] = per_task.get(minute, 0) + int(row["retries"])
    storms: list[RetryStorm] = []
    if not series:
        return storms
    # Every task is walked from the first minute of the data: its quiet minutes
    # before its first retry are part of its normal.
    first = min(min(counts) for counts in series.values())
    for task, counts in series.items():
        calm: deque[int] = deque(maxlen=window)
        last = max(counts)
        current: list[tuple[int, int]] = []  # (minute, retries) of the storm being built
        baseline = 0.0
        quiet = 0
        for minute in range(first, last + 1):
            n = counts.get(minute, 0)
            level = statistics.median(calm) if calm else 0.0
            learning = minute - first < warmup
            if not learning and n >= max(min_retries, factor * max(level, 1.0)):
                if not current:
                    baseline = level
                current.append((minute, n))
                quiet = 0
                continue
            calm.append(n)
            if current:
                quiet += 1
                if quiet > gap:
                    storms.append(_storm(task, current, baseline, counts))
                    current = []
        if current:
            storms.append(_storm(task, current, baseline, counts))
    return sorted(storms, key=lambda s: (s.start_s, s.task_name))


def _storm(task: str, minutes: list[tuple[int, int]], baseline: float, counts: Mapping[int, int]) -> RetryStorm:
    start, end = minutes[0][0], minutes[-1][0]
    return RetryStorm(
        task_name=task,
        start_s=start * 60,
        end_s=(end + 1) * 60,
        peak_per_minute=max(n for _, n in minutes),
        baseline_per_minute=float(baseline),
        retries=sum(counts.get(m, 0) for m in range(start, end + 1)),
    )
