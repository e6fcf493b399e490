"""Malformed input is counted and skipped; hopeless input fails clearly."""

from __future__ import annotations

import gzip
import json

import pytest

from celery_delayq.analytics import (
    EventsNotFoundError,
    NoValidEventsError,
    read_events,
    run_report,
)
from celery_delayq.analytics.schema import STRICT_STRING_TYPES

GOOD = {
    "event": "succeeded",
    "task_id": "t1",
    "task_name": "app.a",
    "queue": "q",
    "attempt": 0,
    "ts": 100.0,
}
GOOD_DELIVERED = {**GOOD, "event": "delivered", "task_id": "t2", "delay_s": 1.0, "due_at": 99.5}
GOOD_RETRIED = {**GOOD, "event": "retried", "task_id": "t3", "exception": "KeyError"}


def without(base: dict, key: str) -> str:
    return json.dumps({k: v for k, v in base.items() if k != key})


def with_(base: dict, /, **changes) -> str:
    return json.dumps({**base, **changes})


BAD_LINES = {
    "not json": "this is not json",
    "truncated": json.dumps(GOOD)[:-7],
    "json array": "[1, 2, 3]",
    "json scalar": "42",
    "missing task_id": without(GOOD, "task_id"),
    "missing task_name": without(GOOD, "task_name"),
    "missing queue": without(GOOD, "queue"),
    "missing attempt": without(GOOD, "attempt"),
    "missing ts": without(GOOD, "ts"),
    "missing event": without(GOOD, "event"),
    "null task_name": with_(GOOD, task_name=None),
    "attempt is a string": with_(GOOD, attempt="x"),
    "attempt numeric string": with_(GOOD, attempt="3"),
    "attempt fractional": with_(GOOD, attempt=1.5),
    "attempt negative": with_(GOOD, attempt=-1),
    "ts is a string": with_(GOOD, ts="1.5"),
    "ts NaN": with_(GOOD, ts=float("nan")),  # json.dumps writes a bare NaN
    "ts is a bool": with_(GOOD, ts=True),
    "unknown event": with_(GOOD, event="started"),
    "event wrong case": with_(GOOD, event="Succeeded"),
    "delivered without due_at": without(GOOD_DELIVERED, "due_at"),
    "delivered without delay_s": without(GOOD_DELIVERED, "delay_s"),
    "delivered due_at string": with_(GOOD_DELIVERED, due_at="later"),
    "retried without exception": without(GOOD_RETRIED, "exception"),
    "parked without exception": without({**GOOD_RETRIED, "event": "parked"}, "exception"),
    "failed with a null exception": with_(GOOD_RETRIED, event="failed", exception=None),
}

# String fields of the wrong JSON type need VARIANT (pyspark >= 4) to detect.
if STRICT_STRING_TYPES:
    BAD_LINES |= {
        "task_id is a number": with_(GOOD, task_id=42),
        "task_name is an object": with_(GOOD, task_name={"a": 1}),
        "queue is a bool": with_(GOOD, queue=False),
        "retried exception not a string": with_(GOOD_RETRIED, exception=7),
    }

GOOD_LINES = [
    json.dumps(GOOD),
    json.dumps(GOOD_DELIVERED),
    json.dumps(GOOD_RETRIED),
    with_(GOOD, task_id="t4", extra_field={"any": "thing"}, host="w1"),  # extras are fine
    with_(GOOD, task_id="t5", ts=101),  # integral ts is still a number
    with_(GOOD_RETRIED, task_id="t7", event="parked"),
    with_(GOOD_RETRIED, task_id="t8", event="failed"),
    with_(GOOD, task_id="t9", event="cancelled", reason="revoked"),
    with_(GOOD, task_id="t10", event="replayed", delay_s=0.0),
    # odd spacing and an exponent are still valid JSON
    '{ "event" : "succeeded" , "task_id":"t6","task_name":"app.a",'
    '"queue":"q","attempt":0,"ts":1e2 }',
]


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_each_kind_of_bad_line_is_counted(spark, write_events, kind):
    valid, malformed = read_events(spark, write_events([json.dumps(GOOD), BAD_LINES[kind]]))
    try:
        assert (valid.count(), malformed) == (1, 1), kind
    finally:
        valid.unpersist()


def test_good_lines_are_all_valid(spark, write_events):
    valid, malformed = read_events(spark, write_events(GOOD_LINES))
    try:
        assert (valid.count(), malformed) == (len(GOOD_LINES), 0)
        assert sorted(r.task_id for r in valid.select("task_id").collect()) == sorted(
            f"t{i}" for i in range(1, 11)
        )
    finally:
        valid.unpersist()


def test_mixed_input_summary_counts_only_valid(spark, write_events, tmp_path):
    lines = [*GOOD_LINES, *BAD_LINES.values(), "", "   "]  # blank lines: ignored, not malformed
    summary = run_report(write_events(lines, files=3), tmp_path / "out", spark=spark)
    assert summary["malformed"] == len(BAD_LINES)
    overall = summary["overall"]
    assert (overall["succeeded"], overall["delivered"], overall["retried"]) == (4, 1, 1)
    assert (overall["parked"], overall["failed"], overall["cancelled"], overall["replayed"]) == (1, 1, 1, 1)
    assert list(summary["tasks"]) == ["app.a"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["malformed"] == len(
        BAD_LINES
    )


def test_gzip_files_are_read(spark, write_events):
    root = write_events([json.dumps(GOOD)])
    with gzip.open(root / "more.jsonl.gz", "wt") as fh:
        fh.write(with_(GOOD, task_id="gz") + "\nnot json\n")
    valid, malformed = read_events(spark, root)
    try:
        assert (valid.count(), malformed) == (2, 1)
    finally:
        valid.unpersist()


def test_hidden_and_underscore_files_are_skipped(spark, write_events):
    root = write_events([json.dumps(GOOD)])
    (root / "_SUCCESS").write_text("not json\n")
    (root / ".events.jsonl.crc").write_text("not json\n")
    valid, malformed = read_events(spark, root)
    try:
        assert (valid.count(), malformed) == (1, 0)
    finally:
        valid.unpersist()


def test_only_malformed_lines_is_an_error(spark, write_events):
    root = write_events(list(BAD_LINES.values()))
    with pytest.raises(NoValidEventsError, match=rf"{len(BAD_LINES)} malformed") as info:
        read_events(spark, root)
    assert info.value.malformed == len(BAD_LINES)


def test_empty_directory_is_an_error(spark, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoValidEventsError, match="no valid events"):
        read_events(spark, tmp_path / "empty")


def test_missing_directory_is_an_error(spark, tmp_path):
    with pytest.raises(EventsNotFoundError, match="not found"):
        read_events(spark, tmp_path / "nope")


def test_run_report_missing_directory_fails_before_writing(tmp_path):
    # No spark fixture: the check must happen before any session is needed.
    with pytest.raises(EventsNotFoundError):
        run_report(tmp_path / "nope", tmp_path / "out")
    assert not (tmp_path / "out").exists()
