"""Shape the collected ``task_summary`` rows into the ``summary.json`` document."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from celery_delayq.analytics.tables import SUMMARY_FIELDS

__all__ = ["build_summary", "empty_stats"]


def empty_stats() -> dict[str, Any]:
    """Statistics of a scope with no events (counts 0, ratios/percentiles null)."""
    return {
        field: (None if field.startswith("lateness_") or field.endswith("_rate") else 0)
        for field in SUMMARY_FIELDS
    }


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; a null is the honest "undefined".
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _stats(row: Mapping[str, Any]) -> dict[str, Any]:
    return {field: _clean(row.get(field)) for field in SUMMARY_FIELDS}


def build_summary(rows: Iterable[Mapping[str, Any]], malformed: int) -> dict[str, Any]:
    """``{"overall": S, "tasks": {task_name: S}, "malformed": N}``.

    ``rows`` are ``task_summary`` rows as dicts (``scope`` ``"overall"`` or
    ``"task"``); tasks are sorted by name so the file diffs cleanly.
    """
    overall = empty_stats()
    tasks: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["scope"] == "overall":
            overall = _stats(row)
        else:
            tasks[row["task_name"]] = _stats(row)
    return {
        "overall": overall,
        "tasks": dict(sorted(tasks.items())),
        "malformed": int(malformed),
    }
