"""The recorder's fast path (record_event with the events' named tuples).

The fast path formats the tuples in the writer thread instead of encoding
dicts; its lines must be exactly what ``record(make_event(...))`` writes.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from celery_delayq.telemetry import TelemetryRecorder, make_event
from celery_delayq.telemetry import EVENT_CLASSES, EVENT_TYPES, encode_event
from celery_delayq.telemetry.recorder import (
    _ENCODE,
    _FAST_LINES,
    EVENT_CLASS,
    TASK_EVENT_EXTRAS,
)

TS = 1710028770.123456  # 2024-03-09 23:59:30 UTC
NEXT_DAY = TS + 30.0

CORE = ("event", "task_id", "task_name", "queue", "attempt", "ts")

# (event, extras) samples covering every event type, extras in TASK_EVENT_EXTRAS order.
SAMPLES: list[tuple[str, tuple[Any, ...]]] = [
    ("scheduled", (2.5, TS + 2.5, "9f1c0b6e0d2a4d0c8b7e6a5f4e3d2c1b", 5)),
    ("delivered", (0.01, TS - 0.003)),
    ("succeeded", ()),
    ("retried", ("TimeoutError",)),
    ("exhausted", ("ValueError",)),
    ("parked", ("PermanentError",)),
    ("failed", ("KeyError",)),
    ("replayed", (30.0,)),
    ("cancelled", ("revoked",)),
]
#: Events written by a formatter of their own (the rest are rare: generic path).
FAST = {"scheduled", "delivered", "succeeded", "retried", "exhausted", "parked", "failed"}


def E(event: str, *values: Any) -> Any:
    """The named tuple of ``event`` with these field values."""
    return EVENT_CLASS[event](*values)


def fast(item: tuple[Any, ...]) -> str:
    """The fast formatter's line for a ``(event, *values)`` tuple."""
    return _FAST_LINES[EVENT_CLASS[item[0]]](E(*item))

# Strings JSON must escape, or that must come out as \uXXXX (ASCII output).
AWKWARD = [
    'say "hi"',
    "back\\slash",
    "line\nbreak\r\ttab",
    "\x00\x1f\x7f",
    "caf\u00e9 \u2603 \U0001f600",
    "\u2028\u2029",
    "",
]


def expected_dict(event: str, task_id: Any, task_name: Any, queue: Any, attempt: Any, ts: Any,
                  *extra: Any) -> dict[str, Any]:
    names = TASK_EVENT_EXTRAS[event]
    extras = {n: float(v) if n in ("delay_s", "due_at") else v for n, v in zip(names, extra)}
    return make_event(event, task_id=task_id, task_name=task_name, queue=queue, attempt=attempt,
                      ts=ts, **extras)


def expected_line(*item: Any) -> str:
    return _ENCODE(expected_dict(*item)) + "\n"


def raw_lines(root: Path) -> list[str]:
    lines: list[str] = []
    for path in sorted(root.rglob("*.jsonl")):
        lines.extend(path.read_text(encoding="utf-8").splitlines(keepends=True))
    return lines


@pytest.fixture
def recorder(tmp_path):
    rec = TelemetryRecorder(tmp_path / "telemetry", flush_interval_s=3600.0)
    yield rec
    rec.close()


# -- formatting ------------------------------------------------------------------------


@pytest.mark.parametrize("event, extra", SAMPLES, ids=[e for e, _ in SAMPLES])
def test_line_is_byte_for_byte_the_generic_one(recorder, tmp_path, event, extra):
    item = (event, str(uuid.uuid4()), "app.tasks.add", "celery", 3, TS, *extra)
    recorder.record_event(E(*item))
    recorder.flush()
    [line] = raw_lines(tmp_path / "telemetry")
    assert line == expected_line(*item) == encode_event(E(*item))
    if event in FAST:
        assert fast(item) == line  # formatted directly, not via the generic fallback
    parsed = json.loads(line)
    assert list(parsed) == [*CORE, *TASK_EVENT_EXTRAS[event]]
    assert parsed == expected_dict(*item)
    assert type(parsed["attempt"]) is int and type(parsed["ts"]) is float
    for name in ("delay_s", "due_at"):
        if name in parsed:
            assert type(parsed[name]) is float
    for name in ("task_id", "task_name", "queue", "entry", "exception", "reason"):
        if name in parsed:
            assert type(parsed[name]) is str
    if event == "scheduled":
        assert type(parsed["hops"]) is int


@pytest.mark.parametrize("text", AWKWARD)
def test_strings_are_escaped(recorder, tmp_path, text):
    items = [
        ("succeeded", text, text, text, 0, TS),
        ("retried", "id", "t", "q", 1, TS, text),
        ("scheduled", "id", "t", "q", 0, TS, 1.0, TS + 1.0, text, 2),
    ]
    for item in items:
        recorder.record_event(E(*item))
    recorder.flush()
    lines = raw_lines(tmp_path / "telemetry")
    assert lines == [expected_line(*item) for item in items]
    assert [fast(item) for item in items] == lines
    assert all(line.isascii() and line.count("\n") == 1 for line in lines)
    assert json.loads(lines[0])["task_id"] == text
    assert json.loads(lines[1])["exception"] == text
    assert json.loads(lines[2])["entry"] == text


@pytest.mark.parametrize("ts", [TS, 0.0, -1.5, 1e-7, 1.0, 123456789012.5, 1710028770.0])
def test_floats_print_like_json(ts):
    # Covers repr corner cases: integral floats keep ".0", exponents, negatives.
    item = ("delivered", "id", "t", "q", 0, ts, ts, ts)
    assert fast(item) == encode_event(E(*item)) == expected_line(*item)


def test_unexpected_types_are_coerced_like_make_event(recorder, tmp_path):
    items = [
        ("succeeded", uuid.UUID(int=7), 42, None, "2", 1710028770),  # str(), int(), float()
        ("succeeded", "id", "t", "q", True, TS),  # bool attempt -> 1
        ("delivered", "id", "t", "q", 0, TS, 2, 1710028772),  # int delay/due -> float
        ("scheduled", "id", "t", "q", 0, TS, 1, TS, "e", None),  # hops stored as given
        ("retried", "id", "t", "q", 1, TS, KeyError("k")),  # exception instance -> type name
        ("exhausted", "id", "t", "q", 5, TS, ValueError),  # exception class -> name
    ]
    for item in items:
        recorder.record_event(E(*item))
    recorder.flush()
    lines = raw_lines(tmp_path / "telemetry")
    assert lines == [expected_line(*item) for item in items]
    first, second, third, fourth, fifth, sixth = (json.loads(x) for x in lines)
    assert (first["task_id"], first["task_name"], first["queue"]) == (str(uuid.UUID(int=7)), "42", "None")
    assert (first["attempt"], first["ts"]) == (2, 1710028770.0)
    assert second["attempt"] == 1 and type(second["attempt"]) is int
    assert (third["delay_s"], third["due_at"]) == (2.0, 1710028772.0)
    assert fourth["hops"] is None
    assert (fifth["exception"], sixth["exception"]) == ("KeyError", "ValueError")
    assert (recorder.written, recorder.dropped) == (6, 0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["ts", "delay_s", "due_at"])
def test_non_finite_floats_are_dropped_and_counted(recorder, tmp_path, bad, field):
    values = {"ts": TS, "delay_s": 1.0, "due_at": TS + 1.0}
    values[field] = bad
    recorder.record_event(E("delivered", "bad", "t", "q", 0, values["ts"], values["delay_s"],
                            values["due_at"]))
    recorder.record_event(E("delivered", "good", "t", "q", 0, TS, 1.0, TS + 1.0))
    if field == "ts":
        recorder.record_event(E("succeeded", "bad2", "t", "q", 0, bad))
    recorder.flush()
    ids = [json.loads(line)["task_id"] for line in raw_lines(tmp_path / "telemetry")]
    assert ids == ["good"]
    assert (recorder.written, recorder.dropped) == (1, 2 if field == "ts" else 1)


def test_unrecordable_events_are_dropped_not_raised(recorder, tmp_path):
    recorder.record_event(("succeeded", "id", "t", "q", 0, TS))  # a plain tuple is no event
    recorder.record_event(E("succeeded", "id", "t", "q", "not-a-number", TS))
    recorder.record_event(E("succeeded", "id", "t", "q", 0, "not-a-time"))
    recorder.record_event(E("replayed", "id", "t", "q", 0, TS, "not-a-delay"))
    recorder.record_event(E("succeeded", "ok", "t", "q", 0, TS))
    recorder.flush()
    assert [json.loads(x)["task_id"] for x in raw_lines(tmp_path / "telemetry")] == ["ok"]
    assert (recorder.written, recorder.dropped) == (1, 4)


def test_every_event_type_has_a_named_tuple():
    assert [cls.event for cls in EVENT_CLASSES] == list(EVENT_TYPES)
    assert all(cls._fields[:5] == CORE[1:] for cls in EVENT_CLASSES)
    parked, exhausted = EVENT_CLASS["parked"], EVENT_CLASS["exhausted"]
    assert parked._fields == exhausted._fields == EVENT_CLASS["failed"]._fields


# -- buffering ---------------------------------------------------------------------------


def test_mixed_with_record_keeps_order_and_partitions(recorder, tmp_path):
    sent: list[dict[str, Any]] = []
    for i in range(6):
        ts = TS if i < 3 else NEXT_DAY
        if i % 2:
            item = ("succeeded", f"id-{i}", "t", "q", 0, ts + i * 0.001)
            recorder.record_event(E(*item))
            sent.append(expected_dict(*item))
        else:
            ev = make_event("succeeded", task_id=f"id-{i}", task_name="t", queue="q", attempt=0,
                            ts=ts + i * 0.001)
            recorder.record(ev)
            sent.append(ev)
    recorder.flush()
    root = tmp_path / "telemetry"
    dirs = sorted(p.parent.relative_to(root).as_posix() for p in root.rglob("*.jsonl"))
    assert dirs == ["date=2024-03-09/hour=23", "date=2024-03-10/hour=00"]
    assert [json.loads(x) for x in raw_lines(root)] == sent
    assert (recorder.written, recorder.dropped) == (6, 0)


def test_size_flush_wakes_the_writer(tmp_path):
    rec = TelemetryRecorder(tmp_path / "t", flush_every=10, flush_interval_s=3600.0)
    try:
        for i in range(9):
            rec.record_event(E("succeeded", f"id-{i}", "t", "q", 0, TS))
        time.sleep(0.2)
        assert rec.written == 0 and rec.buffered == 9
        rec.record_event(E("succeeded", "id-9", "t", "q", 0, TS))
        deadline = time.monotonic() + 5
        while rec.written < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (rec.written, rec.buffered) == (10, 0)
    finally:
        rec.close()


def test_max_buffer_and_close_apply_to_the_fast_path(tmp_path):
    rec = TelemetryRecorder(tmp_path / "t", max_buffer=3, flush_every=1000, flush_interval_s=3600.0)
    for i in range(5):
        rec.record_event(E("succeeded", f"id-{i}", "t", "q", 0, TS))
    assert (rec.buffered, rec.dropped) == (3, 2)
    rec.close()
    rec.record_event(E("succeeded", "late", "t", "q", 0, TS))
    assert (rec.written, rec.dropped) == (3, 3)
    ids = [json.loads(x)["task_id"] for x in raw_lines(tmp_path / "t")]
    assert ids == ["id-0", "id-1", "id-2"]


def test_concurrent_fast_records_with_flushes_lose_nothing(tmp_path):
    rec = TelemetryRecorder(tmp_path / "t", flush_every=37, flush_interval_s=0.001)
    per_thread, n_threads = 3000, 4

    def produce(t: int) -> None:
        for i in range(per_thread):
            rec.record_event(E("succeeded", f"{t}-{i}", "t", "q", 0, TS + i * 1e-6))

    def flusher(stop: threading.Event) -> None:
        while not stop.is_set():
            rec.flush()

    stop = threading.Event()
    extra = threading.Thread(target=flusher, args=(stop,))
    extra.start()
    threads = [threading.Thread(target=produce, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stop.set()
    extra.join()
    rec.close()
    ids = [json.loads(x)["task_id"] for x in raw_lines(tmp_path / "t")]
    assert sorted(ids) == sorted(f"{t}-{i}" for t in range(n_threads) for i in range(per_thread))
    per_thread_order = {t: [int(x.split("-")[1]) for x in ids if x.startswith(f"{t}-")]
                        for t in range(n_threads)}
    assert all(order == sorted(order) for order in per_thread_order.values())
    assert (rec.written, rec.dropped) == (per_thread * n_threads, 0)
