"""The recorder's fast path (record_task_event) and the worker hooks that use it.

The fast path formats tuples in the writer thread instead of encoding dicts;
its lines must be exactly what ``record(make_event(...))`` writes.
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
from celery_delayq.telemetry.recorder import (
    _ENCODE,
    _FAST_LINES,
    TASK_EVENT_EXTRAS,
    encode_task_event,
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
]

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
    recorder.record_task_event(*item)
    recorder.flush()
    [line] = raw_lines(tmp_path / "telemetry")
    assert line == expected_line(*item)
    assert _FAST_LINES[event](item) == line  # formatted directly, not via the generic fallback
    parsed = json.loads(line)
    assert list(parsed) == [*CORE, *TASK_EVENT_EXTRAS[event]]
    assert parsed == expected_dict(*item)
    assert type(parsed["attempt"]) is int and type(parsed["ts"]) is float
    for name in ("delay_s", "due_at"):
        if name in parsed:
            assert type(parsed[name]) is float
    for name in ("task_id", "task_name", "queue", "entry", "exception"):
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
        recorder.record_task_event(*item)
    recorder.flush()
    lines = raw_lines(tmp_path / "telemetry")
    assert lines == [expected_line(*item) for item in items]
    assert [_FAST_LINES[item[0]](item) for item in items] == lines
    assert all(line.isascii() and line.count("\n") == 1 for line in lines)
    assert json.loads(lines[0])["task_id"] == text
    assert json.loads(lines[1])["exception"] == text
    assert json.loads(lines[2])["entry"] == text


@pytest.mark.parametrize("ts", [TS, 0.0, -1.5, 1e-7, 1.0, 123456789012.5, 1710028770.0])
def test_floats_print_like_json(ts):
    # Covers repr corner cases: integral floats keep ".0", exponents, negatives.
    item = ("delivered", "id", "t", "q", 0, ts, ts, ts)
    assert _FAST_LINES["delivered"](item) == encode_task_event(item) == expected_line(*item)


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
        recorder.record_task_event(*item)
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
    recorder.record_task_event("delivered", "bad", "t", "q", 0, values["ts"], values["delay_s"],
                               values["due_at"])
    recorder.record_task_event("delivered", "good", "t", "q", 0, TS, 1.0, TS + 1.0)
    if field == "ts":
        recorder.record_task_event("succeeded", "bad2", "t", "q", 0, bad)
    recorder.flush()
    ids = [json.loads(line)["task_id"] for line in raw_lines(tmp_path / "telemetry")]
    assert ids == ["good"]
    assert (recorder.written, recorder.dropped) == (1, 2 if field == "ts" else 1)


def test_unrecordable_tuples_are_dropped_not_raised(recorder, tmp_path):
    recorder.record_task_event("started", "id", "t", "q", 0, TS)  # unknown event
    recorder.record_task_event("delivered", "id", "t", "q", 0, TS)  # extras missing
    recorder.record_task_event("succeeded", "id", "t", "q", 0, TS, "surplus")
    recorder.record_task_event("succeeded", "id", "t", "q", "not-a-number", TS)
    recorder.record_task_event("succeeded", "id", "t", "q", 0, "not-a-time")
    recorder.record_task_event("succeeded", "ok", "t", "q", 0, TS)
    recorder.flush()
    assert [json.loads(x)["task_id"] for x in raw_lines(tmp_path / "telemetry")] == ["ok"]
    assert (recorder.written, recorder.dropped) == (1, 5)


# -- buffering ---------------------------------------------------------------------------


def test_mixed_with_record_keeps_order_and_partitions(recorder, tmp_path):
    sent: list[dict[str, Any]] = []
    for i in range(6):
        ts = TS if i < 3 else NEXT_DAY
        if i % 2:
            item = ("succeeded", f"id-{i}", "t", "q", 0, ts + i * 0.001)
            recorder.record_task_event(*item)
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
            rec.record_task_event("succeeded", f"id-{i}", "t", "q", 0, TS)
        time.sleep(0.2)
        assert rec.written == 0 and rec.buffered == 9
        rec.record_task_event("succeeded", "id-9", "t", "q", 0, TS)
        deadline = time.monotonic() + 5
        while rec.written < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (rec.written, rec.buffered) == (10, 0)
    finally:
        rec.close()


def test_max_buffer_and_close_apply_to_the_fast_path(tmp_path):
    rec = TelemetryRecorder(tmp_path / "t", max_buffer=3, flush_every=1000, flush_interval_s=3600.0)
    for i in range(5):
        rec.record_task_event("succeeded", f"id-{i}", "t", "q", 0, TS)
    assert (rec.buffered, rec.dropped) == (3, 2)
    rec.close()
    rec.record_task_event("succeeded", "late", "t", "q", 0, TS)
    assert (rec.written, rec.dropped) == (3, 3)
    ids = [json.loads(x)["task_id"] for x in raw_lines(tmp_path / "t")]
    assert ids == ["id-0", "id-1", "id-2"]


def test_concurrent_fast_records_with_flushes_lose_nothing(tmp_path):
    rec = TelemetryRecorder(tmp_path / "t", flush_every=37, flush_interval_s=0.001)
    per_thread, n_threads = 3000, 4

    def produce(t: int) -> None:
        for i in range(per_thread):
            rec.record_task_event("succeeded", f"{t}-{i}", "t", "q", 0, TS + i * 1e-6)

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


# -- the worker hooks ----------------------------------------------------------------------


@pytest.fixture
def telemetry_app(tmp_path):
    """A Celery app (no broker needed) with delayq installed and telemetry on."""
    from celery import Celery

    import celery_delayq
    from celery_delayq import DelayedRetryTask

    apps: list[Any] = []

    def factory(root: Path | None) -> tuple[Any, Any]:
        app = Celery(f"fast{uuid.uuid4().hex[:6]}", set_as_current=False)
        app.conf.update(delayq_telemetry_dir=str(root) if root else None)
        celery_delayq.install(app)
        apps.append(app)

        @app.task(base=DelayedRetryTask, shared=False)
        def work(i: int) -> int:
            return i

        return app, app.tasks[work.name]

    yield factory
    for app in apps:
        celery_delayq.uninstall(app)


def _worker_request(app: Any, task: Any, *, retries: int = 0) -> Any:
    from celery.contrib.testing.mocks import TaskMessage
    from celery.worker.request import Request

    from celery_delayq import headers as H

    message = TaskMessage(task.name, id="req-1", args=(1,), retries=retries,
                          **{H.DUE: TS, H.DELAY: 0.5, H.ENTRY: "e1", H.HOPS: 2})
    message.delivery_info = {"exchange": "", "routing_key": "jobs", "redelivered": False}
    return Request(message, app=app, task=task)


def _flushed(root: Path) -> list[dict[str, Any]]:
    from celery_delayq.telemetry.wiring import flush_all

    flush_all()
    return [json.loads(x) for x in raw_lines(root)]


def test_hooks_write_the_contract_fields(telemetry_app, tmp_path):
    from celery import signals as celery_signals

    from celery_delayq import signals
    from celery_delayq.telemetry.wiring import recorder_for

    root = tmp_path / "hooks"
    app, task = telemetry_app(root)
    request = _worker_request(app, task, retries=2)
    before = time.time()
    signals.message_delivered.send(sender=task, request=request, due=TS, delay=0.5, lateness=0.0)
    task.push_request(request.request_dict, args=(1,), kwargs={}, called_directly=False)
    try:
        celery_signals.task_success.send(sender=task, result=1, runtime=0.0)
        celery_signals.task_retry.send(sender=task, request=task.request,
                                       reason=type("Retry", (), {"exc": TimeoutError()})(), einfo=None)
        signals.retry_exhausted.send(sender=task, request=task.request, exc=KeyError("x"))
    finally:
        task.pop_request()
    delivered, succeeded, retried, exhausted = _flushed(root)
    base = {"task_id": "req-1", "task_name": task.name, "queue": "jobs", "attempt": 2}
    assert delivered == {"event": "delivered", **base, "ts": delivered["ts"], "delay_s": 0.5, "due_at": TS}
    assert succeeded == {"event": "succeeded", **base, "ts": succeeded["ts"]}
    assert retried == {"event": "retried", **base, "ts": retried["ts"], "exception": "TimeoutError"}
    assert exhausted == {"event": "exhausted", **base, "ts": exhausted["ts"], "exception": "KeyError"}
    assert all(before <= ev["ts"] <= time.time() for ev in (delivered, succeeded, retried, exhausted))
    assert recorder_for(str(root)).dropped == 0


def test_scheduled_hook(tmp_path):
    from types import SimpleNamespace

    from celery_delayq import headers as H
    from celery_delayq import signals

    class Publisher:  # what the hook reads of a LadderPublisher (signal senders must be hashable)
        config = SimpleNamespace(telemetry_dir=str(tmp_path / "sched"))

    root = tmp_path / "sched"
    publisher = Publisher()
    plan = SimpleNamespace(entry="e" * 32, delay=2, due=TS, hops=4,
                           destination=SimpleNamespace(routing_key="jobs"))
    signals.message_scheduled.send(sender=publisher, plan=plan,
                                   headers={"id": "t-1", "task": "app.add", H.ATTEMPT: 1})
    signals.message_scheduled.send(sender=publisher, plan=plan, headers={})
    first, second = _flushed(root)
    assert first == {"event": "scheduled", "task_id": "t-1", "task_name": "app.add", "queue": "jobs",
                     "attempt": 1, "ts": first["ts"], "delay_s": 2.0, "due_at": TS,
                     "entry": "e" * 32, "hops": 4}
    assert (second["task_id"], second["task_name"], second["attempt"]) == ("e" * 32, "", 0)


def test_recorder_follows_install_and_apps(telemetry_app, tmp_path):
    import celery_delayq
    from celery import signals as celery_signals

    def succeed(task: Any, task_id: str) -> None:
        task.push_request({"id": task_id, "task": task.name, "delivery_info": {"routing_key": "q"},
                           "retries": 0}, called_directly=False)
        try:
            celery_signals.task_success.send(sender=task, result=None, runtime=0.0)
        finally:
            task.pop_request()

    app_a, task_a = telemetry_app(tmp_path / "a")
    app_b, task_b = telemetry_app(tmp_path / "b")
    app_off, task_off = telemetry_app(None)
    succeed(task_a, "a1")
    succeed(task_b, "b1")
    succeed(task_off, "off1")
    celery_delayq.uninstall(app_a)  # not installed: no telemetry
    succeed(task_a, "a2")
    app_a.conf.delayq_telemetry_dir = str(tmp_path / "a-again")
    celery_delayq.install(app_a)  # a new router reads the new setting
    succeed(task_a, "a3")
    assert [ev["task_id"] for ev in _flushed(tmp_path / "a")] == ["a1"]
    assert [ev["task_id"] for ev in _flushed(tmp_path / "a-again")] == ["a3"]
    assert [ev["task_id"] for ev in _flushed(tmp_path / "b")] == ["b1"]
    assert not list(tmp_path.rglob("*off1*"))
