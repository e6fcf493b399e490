"""Shape the collected summary rows into the ``summary.json`` document."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery_delayq.analytics.schema import EVENT_TYPES
from celery_delayq.analytics.tables import SUMMARY_FIELDS

__all__ = ["QUEUE_FIELDS", "build_summary", "empty_stats"]

#: The per-queue statistics, in ``summary.json`` order.
QUEUE_FIELDS: tuple[str, ...] = (*EVENT_TYPES, "lateness_p50_ms", "lateness_p99_ms", "early")


def empty_stats(fields: Sequence[str] = SUMMARY_FIELDS) -> dict[str, Any]:
    """Statistics of a scope with no events (counts 0, ratios/percentiles null)."""
    return {field: (None if field.startswith("lateness_") or field.endswith("_rate") else 0) for field in fields}


def _stats(row: Mapping[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    # JSON has no NaN/inf; a null is the honest "undefined".
    return {field: None if isinstance(v := row.get(field), float) and not math.isfinite(v) else v for field in fields}


def build_summary(rows: Iterable[Mapping[str, Any]], malformed: int, *, queues: Iterable[Mapping[str, Any]] = (),
                  storms: Iterable[Mapping[str, Any]] = (), window: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"overall": S, "tasks": {task_name: S}, "queues": {queue: Q}, "malformed": N, ...}``, names sorted.

    ``rows``: ``task_summary`` rows; ``queues``: ``queue_summary`` rows; ``storms``: retry storms;
    ``window``: the ``since``/``until``/``files`` the report covers.
    """
    overall = empty_stats()
    tasks: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["scope"] == "overall":
            overall = _stats(row, SUMMARY_FIELDS)
        else:
            tasks[row["task_name"]] = _stats(row, SUMMARY_FIELDS)
    by_queue = {row["queue"]: _stats(row, QUEUE_FIELDS) for row in queues}
    return {
        "overall": overall,
        "tasks": dict(sorted(tasks.items())),
        "queues": dict(sorted(by_queue.items())),
        "retry_storms": [dict(s) for s in storms],
        "malformed": int(malformed),
        "window": dict(window or {}),
    }
