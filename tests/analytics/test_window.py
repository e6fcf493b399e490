"""``--since/--until`` and ``--incremental``: which files and events a report covers."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_delayq.analytics import NoValidEventsError, run_report
from celery_delayq.telemetry.files import IncrementalState, list_event_files, split_sealed

H0 = 1_704_067_200.0  # 2024-01-01T00:00:00Z


def _write_hour(root: Path, start: float, n: int, name: str = "events-w-1.jsonl", task: str = "app.w") -> Path:
    """``n`` succeeded events in the recorder's partition of ``start``'s hour."""
    moment = datetime.fromtimestamp(start, tz=timezone.utc)
    part = root / f"date={moment:%Y-%m-%d}" / f"hour={moment:%H}"
    part.mkdir(parents=True, exist_ok=True)
    path = part / name
    with open(path, "a") as fh:
        for i in range(n):
            fh.write(json.dumps({"event": "succeeded", "task_id": f"{name}-{start}-{i}", "task_name": task,
                                 "queue": "q", "attempt": 0, "ts": start + 10 + i}) + "\n")
    return path


def test_listing_prunes_hours_outside_the_window(tmp_path):
    root = tmp_path / "ev"
    for h in range(4):
        _write_hour(root, H0 + h * 3600, 2)
    (root / "flat.jsonl").write_text('{"x": 1}\n')  # outside the layout: always listed
    (root / "_SUCCESS").write_text("")
    (root / "date=2024-01-01" / "hour=09").mkdir()
    (root / "date=2024-01-01" / "hour=09" / "empty.jsonl").write_text("")

    def hours(**window):
        return sorted(f.path.split("hour=")[1][:2] if "hour=" in f.path else "flat"
                      for f in list_event_files(str(root), **window))

    assert hours() == ["00", "01", "02", "03", "flat"]
    assert hours(since=H0 + 3600) == ["01", "02", "03", "flat"]
    assert hours(since=H0 + 3600 + 1800, until=H0 + 3 * 3600) == ["01", "02", "flat"]


def test_sealed_and_open_files(tmp_path):
    root = tmp_path / "ev"
    old = _write_hour(root, H0, 1)
    now = time.time()
    fresh = _write_hour(root, now, 1)
    sealed, still_open = split_sealed(list_event_files(str(root)), now=now)
    assert [f.path for f in sealed] == [str(old)] and [f.path for f in still_open] == [str(fresh)]


def test_since_until_keep_the_window(spark, tmp_path):
    root = tmp_path / "ev"
    for h in range(3):
        _write_hour(root, H0 + h * 3600, 5)
    summary = run_report(root, tmp_path / "out", spark=spark, since=H0 + 3600, until=H0 + 2 * 3600 + 12)
    # hour 01 (5 events) and the first two of hour 02 (ts = start + 10, + 11)
    assert summary["overall"]["succeeded"] == 7
    assert summary["window"]["since"] == H0 + 3600 and summary["window"]["files"] == 2


def test_incremental_reads_each_finished_file_once(spark, tmp_path):
    root, out = tmp_path / "ev", tmp_path / "out"
    _write_hour(root, H0, 3)
    _write_hour(root, H0 + 3600, 4)
    live = _write_hour(root, time.time(), 2)  # this hour: may still grow

    first = run_report(root, out, spark=spark, incremental=True)
    assert first["overall"]["succeeded"] == 9
    assert (first["window"]["files_new"], first["window"]["files_open"]) == (2, 1)
    assert len(IncrementalState(out).files) == 2

    second = run_report(root, out, spark=spark, incremental=True)
    assert second["overall"]["succeeded"] == 9  # nothing counted twice
    assert second["window"]["files_new"] == 0

    _write_hour(root, H0 + 2 * 3600, 5)
    with open(live, "a") as fh:  # the live file grew: read again, whole
        fh.write(json.dumps({"event": "failed", "task_id": "late", "task_name": "app.w", "queue": "q",
                             "attempt": 0, "ts": time.time(), "exception": "KeyError"}) + "\n")
        fh.write("not json\n")
    third = run_report(root, out, spark=spark, incremental=True)
    assert third["window"]["files_new"] == 1
    assert (third["overall"]["succeeded"], third["overall"]["failed"]) == (14, 1)
    assert third["malformed"] == 1

    windowed = run_report(root, out, spark=spark, incremental=True, since=H0 + 3600, until=H0 + 2 * 3600)
    assert windowed["overall"]["succeeded"] == 4 and windowed["overall"]["failed"] == 0


def test_a_window_without_files_is_named_before_spark_starts(tmp_path):
    """No spark fixture: a ``--since/--until`` that no event file's hour meets is refused with the window."""
    root = tmp_path / "ev"
    _write_hour(root, H0, 2)
    with pytest.raises(NoValidEventsError) as info:
        run_report(root, tmp_path / "out", since=H0 + 5 * 3600, until=H0 + 6 * 3600)
    assert str(info.value) == (f"no event files under {root} between 2024-01-01T05:00:00Z and 2024-01-01T06:00:00Z")


def test_an_incremental_window_without_events_names_the_window(spark, tmp_path):
    root = tmp_path / "ev"
    _write_hour(root, H0, 2)
    with pytest.raises(NoValidEventsError, match=r"no valid events under .* between 2024-01-01T05:00:00Z and now"):
        run_report(root, tmp_path / "out", spark=spark, since=H0 + 5 * 3600, incremental=True)
