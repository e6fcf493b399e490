"""Fixtures for the PySpark analytics tests.

Without pyspark (the optional ``analytics`` extra) the whole directory is
skipped locally, but CI (``CI`` set) must have it: there a missing pyspark is
an error, so the suite can't silently go green without running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.synthetic makes the events

_MISSING = [name for name in ("pyspark", "matplotlib") if importlib.util.find_spec(name) is None]
if _MISSING:
    message = f"analytics tests need {', '.join(_MISSING)}: pip install 'celery_delayq[analytics]'"
    if os.environ.get("CI"):
        raise RuntimeError(message)
    pytest.skip(message, allow_module_level=True)


@pytest.fixture(scope="session")
def spark():
    """One small local SparkSession for the whole test session."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("celery-delayq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


EventLine = dict[str, Any] | str


@pytest.fixture
def write_events(tmp_path: Path) -> Callable[..., Path]:
    """Write events (dicts become JSON, strings are written verbatim) as JSONL.

    ``write_events(lines, name="events", files=1)`` spreads the lines over
    ``files`` files in a recorder-like ``date=/hour=`` layout and returns
    the directory.
    """

    def write(lines: Iterable[EventLine], name: str = "events", files: int = 1) -> Path:
        root = tmp_path / name
        rendered = [line if isinstance(line, str) else json.dumps(line) for line in lines]
        for i in range(files):
            part = root / "date=2024-01-01" / f"hour={i:02d}"
            part.mkdir(parents=True, exist_ok=True)
            chunk = rendered[i::files]
            (part / f"events-test-{i}.jsonl").write_text("".join(f"{line}\n" for line in chunk))
        return root

    return write


def _ev(
    event: str,
    task_id: str,
    ts: float,
    *,
    task: str = "app.a",
    attempt: int = 0,
    queue: str = "q",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "event": event,
        "task_id": task_id,
        "task_name": task,
        "queue": queue,
        "attempt": attempt,
        "ts": ts,
        **extra,
    }


@pytest.fixture
def ev() -> Callable[..., dict[str, Any]]:
    """``ev(event, task_id, ts, task=..., attempt=..., **extra)``: one event dict."""
    return _ev
