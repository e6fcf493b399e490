"""Tests for the telemetry recorder against the real filesystem."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from celery_delayq.telemetry import EVENT_TYPES, TelemetryRecorder, make_event

# 2024-03-09 23:59:30 UTC and 30 s later (next day, hour 00).
TS_BEFORE_MIDNIGHT = 1710028770.0
TS_AFTER_MIDNIGHT = TS_BEFORE_MIDNIGHT + 30.0


def read_lines(root: Path) -> list[dict]:
    events = []
    for path in sorted(root.rglob("*.jsonl")):
        events.extend(json.loads(line) for line in path.read_text().splitlines())
    return events


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def sample_event(i: int = 0, ts: float = TS_BEFORE_MIDNIGHT, **extra) -> dict:
    return make_event(
        "scheduled",
        task_id=f"id-{i}",
        task_name="app.tasks.add",
        queue="default",
        attempt=0,
        ts=ts,
        delay_s=2.0,
        due_at=ts + 2.0,
        **extra,
    )


@pytest.fixture
def recorder_factory(tmp_path):
    made: list[TelemetryRecorder] = []

    def factory(root=None, **kwargs) -> TelemetryRecorder:
        kwargs.setdefault("flush_interval_s", 3600.0)  # only explicit/size flushes
        rec = TelemetryRecorder(root if root is not None else tmp_path / "telemetry", **kwargs)
        made.append(rec)
        return rec

    yield factory
    for rec in made:
        rec.close()


# -- make_event --------------------------------------------------------------


def test_make_event_builds_contract_fields():
    ev = make_event(
        "retried",
        task_id=123,
        task_name="t",
        queue="q",
        attempt="2",
        ts=5,
        exception=ValueError("boom"),
        host="w1",
    )
    assert ev == {
        "event": "retried",
        "task_id": "123",
        "task_name": "t",
        "queue": "q",
        "attempt": 2,
        "ts": 5.0,
        "exception": "ValueError",
        "host": "w1",
    }
    assert isinstance(ev["ts"], float) and isinstance(ev["attempt"], int)


def test_make_event_exception_class_and_default_ts():
    before = time.time()
    ev = make_event(
        "exhausted", task_id="a", task_name="t", queue="q", attempt=3, exception=KeyError
    )
    assert ev["exception"] == "KeyError"
    assert before <= ev["ts"] <= time.time()


def test_make_event_rejects_unknown_event():
    with pytest.raises(ValueError, match="unknown telemetry event"):
        make_event("started", task_id="a", task_name="t", queue="q", attempt=0)
    assert set(EVENT_TYPES) == {"scheduled", "delivered", "succeeded", "retried", "exhausted",
                                "parked", "failed", "replayed", "cancelled"}


# -- writing -------------------------------------------------------------------


def test_events_round_trip_in_order(recorder_factory, tmp_path):
    rec = recorder_factory()
    sent = [sample_event(i, ts=TS_BEFORE_MIDNIGHT + i * 0.001) for i in range(50)]
    for ev in sent:
        rec.record(ev)
    rec.close()
    assert read_lines(tmp_path / "telemetry") == sent
    assert (rec.written, rec.dropped) == (50, 0)


def test_record_copies_the_event(recorder_factory, tmp_path):
    rec = recorder_factory()
    ev = sample_event()
    rec.record(ev)
    ev["task_id"] = "mutated"
    rec.flush()
    assert read_lines(tmp_path / "telemetry")[0]["task_id"] == "id-0"


def test_partitions_by_utc_date_and_hour(recorder_factory, tmp_path):
    rec = recorder_factory()
    rec.record(sample_event(1, ts=TS_BEFORE_MIDNIGHT))
    rec.record(sample_event(2, ts=TS_AFTER_MIDNIGHT))
    rec.record(sample_event(3, ts=TS_AFTER_MIDNIGHT + 3600))
    rec.flush()

    root = tmp_path / "telemetry"
    files = sorted(p.relative_to(root) for p in root.rglob("*.jsonl"))
    assert [f.parent.as_posix() for f in files] == [
        "date=2024-03-09/hour=23",
        "date=2024-03-10/hour=00",
        "date=2024-03-10/hour=01",
    ]
    pattern = rf"events-{re.escape(socket.gethostname())}-{os.getpid()}-[0-9a-f]{{8}}\.jsonl"
    assert all(re.fullmatch(pattern, f.name) for f in files)
    assert {f.name for f in files} == {rec.filename}
    by_dir = {f.parent.as_posix(): json.loads((root / f).read_text())["task_id"] for f in files}
    assert by_dir == {
        "date=2024-03-09/hour=23": "id-1",
        "date=2024-03-10/hour=00": "id-2",
        "date=2024-03-10/hour=01": "id-3",
    }


def test_event_without_usable_ts_is_filed_under_clock(recorder_factory, tmp_path):
    rec = recorder_factory(clock=lambda: TS_AFTER_MIDNIGHT)
    rec.record({"event": "scheduled", "ts": "not-a-number"})
    rec.record({"event": "scheduled"})
    rec.flush()
    files = list((tmp_path / "telemetry").rglob("*.jsonl"))
    assert [f.parent.relative_to(tmp_path / "telemetry").as_posix() for f in files] == [
        "date=2024-03-10/hour=00"
    ]
    assert rec.written == 2


def test_flush_on_size_only_when_threshold_reached(recorder_factory, tmp_path):
    rec = recorder_factory(flush_every=10, flush_interval_s=3600.0)
    root = tmp_path / "telemetry"
    for i in range(9):
        rec.record(sample_event(i))
    time.sleep(0.2)
    assert not list(root.rglob("*.jsonl")), "flushed before reaching flush_every"
    rec.record(sample_event(9))
    assert wait_for(lambda: len(read_lines(root)) == 10 if root.exists() else False)
    assert rec.written == 10 and rec.buffered == 0


def test_flush_on_interval(recorder_factory, tmp_path):
    rec = recorder_factory(flush_every=1_000_000, flush_interval_s=0.05)
    root = tmp_path / "telemetry"
    rec.record(sample_event())
    # The counter moves once the append has returned: wait for both, not for the line alone.
    assert wait_for(lambda: root.exists() and len(read_lines(root)) == 1 and rec.written == 1)


def test_concurrent_record_from_threads(recorder_factory, tmp_path):
    rec = recorder_factory(flush_every=64)
    per_thread, n_threads = 500, 4

    def worker(t: int) -> None:
        for i in range(per_thread):
            rec.record(sample_event(t * per_thread + i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.close()
    ids = [ev["task_id"] for ev in read_lines(tmp_path / "telemetry")]
    assert sorted(ids) == sorted(f"id-{i}" for i in range(per_thread * n_threads))
    assert (rec.written, rec.dropped) == (per_thread * n_threads, 0)


# -- failure handling ------------------------------------------------------------


def test_uncreatable_directory_drops_and_counts(recorder_factory, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("regular file")
    rec = recorder_factory(root=blocker / "telemetry")
    with caplog.at_level(logging.WARNING, logger="celery_delayq.telemetry.recorder"):
        for i in range(5):
            rec.record(sample_event(i))
        rec.flush()  # must not raise
        rec.close()
    assert (rec.written, rec.dropped) == (0, 5)
    assert "cannot write telemetry" in caplog.text
    assert blocker.read_text() == "regular file"


def test_disk_full_drops_and_counts(recorder_factory, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full to simulate ENOSPC")
    root = tmp_path / "telemetry"
    rec = recorder_factory(root=root)
    partition = root / "date=2024-03-09" / "hour=23"
    partition.mkdir(parents=True)
    (partition / rec.filename).symlink_to("/dev/full")  # every write -> ENOSPC

    rec.record(sample_event(1, ts=TS_BEFORE_MIDNIGHT))
    rec.record(sample_event(2, ts=TS_BEFORE_MIDNIGHT))
    rec.record(sample_event(3, ts=TS_AFTER_MIDNIGHT))  # other partition: still written
    rec.flush()
    assert (rec.written, rec.dropped) == (1, 2)
    assert [ev["task_id"] for ev in read_lines(root / "date=2024-03-10")] == ["id-3"]


def test_warnings_are_rate_limited(recorder_factory, tmp_path, caplog):
    now = [1000.0]
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = recorder_factory(root=blocker / "x", clock=lambda: now[0], warn_every_s=60.0)
    with caplog.at_level(logging.WARNING, logger="celery_delayq.telemetry.recorder"):
        for _ in range(3):
            rec.record(sample_event())
            rec.flush()
        assert len(caplog.records) == 1
        now[0] += 61.0
        rec.record(sample_event())
        rec.flush()
        assert len(caplog.records) == 2
        assert "2 similar warning(s) suppressed" in caplog.records[1].getMessage()
    assert rec.dropped == 4


def test_max_buffer_drops_newest(recorder_factory, tmp_path):
    rec = recorder_factory(max_buffer=3, flush_every=1000)
    for i in range(5):
        rec.record(sample_event(i))
    assert (rec.buffered, rec.dropped) == (3, 2)
    rec.flush()
    assert [ev["task_id"] for ev in read_lines(tmp_path / "telemetry")] == ["id-0", "id-1", "id-2"]
    assert rec.written == 3


def test_bad_events_never_raise(recorder_factory, tmp_path):
    rec = recorder_factory()
    rec.record(None)  # type: ignore[arg-type]  # not a mapping
    circular: dict = sample_event(1)
    circular["self"] = circular
    rec.record(circular)
    rec.record(sample_event(2, note=float("nan")))  # NaN is not valid JSON
    rec.record(sample_event(3, obj=object()))  # unknown type: stored as text
    rec.flush()
    assert (rec.written, rec.dropped) == (1, 3)
    [line] = read_lines(tmp_path / "telemetry")
    assert line["task_id"] == "id-3" and line["obj"].startswith("<object object")


def test_record_after_close_is_dropped(recorder_factory):
    rec = recorder_factory()
    rec.close()
    rec.close()  # idempotent
    rec.record(sample_event())
    assert (rec.written, rec.dropped) == (0, 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_gets_fresh_buffer_and_file(recorder_factory, tmp_path):
    root = tmp_path / "telemetry"
    rec = recorder_factory(root=root)
    rec.record(sample_event(0))  # buffered in the parent at fork time
    parent_file = rec.filename

    pid = os.fork()
    if pid == 0:  # child: report problems through the exit code only
        code = 0
        try:
            if rec.buffered != 0 or rec.filename == parent_file:
                code = 2
            rec.record(sample_event(1))
            rec.close()
            if rec.written != 1:
                code = 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0

    rec.close()
    by_file: dict[str, list[str]] = {}
    for path in root.rglob("*.jsonl"):
        by_file[path.name] = [json.loads(line)["task_id"] for line in path.read_text().splitlines()]
    assert by_file.pop(parent_file) == ["id-0"]
    [(child_file, child_ids)] = by_file.items()
    assert child_ids == ["id-1"] and f"-{pid}-" in child_file
