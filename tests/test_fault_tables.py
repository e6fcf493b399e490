"""The at-load fault table (benchmarks/faults/run.py): which rows pass, and their notes (pure)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for benchmarks.faults
from benchmarks.faults.run import LOAD_COLUMNS, load_markdown  # noqa: E402


def _row(**over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {c: 0 for c in LOAD_COLUMNS}
    row.update(broker="3.10.8", dlx_confirm_timeout_ms="default (180000)", outage_s=50.0, late_max_s=60.0)
    row.update(over)
    return row


def test_a_row_passes_only_within_the_outage_plus_30_s_with_nothing_lost_or_early() -> None:
    doc = {"when": "2026-11-25", "tasks": 5000, "conditions": "busy machine.",
           "rows": [_row(), _row(late_max_s=361.6), _row(lost=1), _row(early=2, note="a note")]}
    text = load_markdown(doc)
    rows = [line for line in text.splitlines() if line.startswith("| 3.10.8")]
    assert [line.rsplit("|", 2)[1].strip() for line in rows] == ["yes", "**no**", "**no**", "**no** (1)"]
    assert "1. a note" in text and "busy machine." in text and "--tasks 5000" in text
    assert "dead_letter_worker_publisher_confirm_timeout" in text  # the cause is stated with the table


def test_no_rows_no_section() -> None:
    assert load_markdown({"rows": []}) == ""
