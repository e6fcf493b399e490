"""Report tables and run_report on small, hand-built event sets.

Expected values are written out from the events below: counts by hand,
lateness as ``(ts - due_at) * 1000`` of the named delivered event.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from celery_delayq.analytics import build_tables, read_events, run_report
from celery_delayq.analytics.lateness import HAS_SKETCHES
from benchmarks.synthetic import generate
from celery_delayq.analytics.tables import MIN_DELAY_BUCKET_EXP, delay_bucket
from celery_delayq.telemetry import TelemetryRecorder, make_event

A, B = "app.a", "app.b"


def delivered(ev, task_id, ts, delay, due, **kw):
    return ev("delivered", task_id, ts, delay_s=delay, due_at=due, **kw)


def scheduled(ev, task_id, ts, delay, **kw):
    return ev("scheduled", task_id, ts, delay_s=delay, due_at=ts + delay, **kw)


@pytest.fixture
def events(ev):
    """Named events; comments give each chain's story."""
    e = {
        # a1: on time-ish, succeeds first try.
        "a1_s": scheduled(ev, "a1", 1000.0, 2.0),
        "a1_d": delivered(ev, "a1", 1002.010, 2.0, 1002.0),
        "a1_ok": ev("succeeded", "a1", 1002.5),
        # a2: retried once, second delivery 5 ms early, then succeeds.
        "a2_s0": scheduled(ev, "a2", 1010.0, 8.0),
        "a2_d0": delivered(ev, "a2", 1018.030, 8.0, 1018.0),
        "a2_r0": ev("retried", "a2", 1019.0, exception="ConnectionError"),
        "a2_s1": scheduled(ev, "a2", 1019.0, 16.0, attempt=1),
        "a2_d1": delivered(ev, "a2", 1034.995, 16.0, 1035.0, attempt=1),
        "a2_ok": ev("succeeded", "a2", 1036.0, attempt=1),
        # a3: zero delay, retried twice, exhausted (never succeeds).
        "a3_s0": scheduled(ev, "a3", 1060.0, 0.0),
        "a3_d0": delivered(ev, "a3", 1060.002, 0.0, 1060.0),
        "a3_r0": ev("retried", "a3", 1061.0, exception="TimeoutError"),
        "a3_d1": delivered(ev, "a3", 1125.0, 3.0, 1124.9, attempt=1),
        "a3_r1": ev("retried", "a3", 1125.5, attempt=1, exception="ConnectionError"),
        "a3_x": ev("exhausted", "a3", 1200.0, attempt=2, exception="ConnectionError"),
        # a4: retried in the same minute as a3, then succeeds.
        "a4_r0": ev("retried", "a4", 1070.0, exception="TimeoutError"),
        "a4_ok": ev("succeeded", "a4", 1130.0, attempt=1),
        # b1: 100 ms late, succeeds.
        "b1_d": delivered(ev, "b1", 2000.100, 4.0, 2000.0, task=B),
        "b1_ok": ev("succeeded", "b1", 2000.2, task=B),
        # b2: retried, then succeeds.
        "b2_r0": ev("retried", "b2", 2010.0, task=B, exception="ValueError"),
        "b2_ok": ev("succeeded", "b2", 2070.0, task=B, attempt=1),
        # b3: succeeds, *then* retries (not a success after retry); tiny delay.
        "b3_ok": ev("succeeded", "b3", 2100.0, task=B),
        "b3_r0": ev("retried", "b3", 2200.0, task=B, exception="KeyError"),
        "b3_s1": scheduled(ev, "b3", 2200.0, 0.0001, task=B, attempt=1),
        "b3_d1": delivered(ev, "b3", 2200.0011, 0.0001, 2200.0001, task=B, attempt=1),
        # a3 is parked after it was exhausted, and replayed by an operator later.
        "a3_p": ev("parked", "a3", 1200.001, attempt=2, exception="ConnectionError"),
        "a3_rp": ev("replayed", "a3", 1800.0, attempt=2, delay_s=0.0),
        # b4 fails for good (no retry, not parked); b5 is revoked when it arrives.
        "b4_f": ev("failed", "b4", 2300.0, task=B, exception="ValueError"),
        "b5_c": ev("cancelled", "b5", 2400.0, task=B, reason="revoked"),
    }
    # Task B's messages go through queue "qb", task A's through "q".
    for name, event in e.items():
        if event["task_name"] == B:
            event["queue"] = "qb"
    return e


@pytest.fixture
def events_dir(events, write_events):
    return write_events(events.values(), files=3)


@pytest.fixture(params=[pytest.param(True, id="kll-sketches"),
                        pytest.param(False, id="percentile_approx")])
def tables(request, spark, events_dir):
    """The tables, with each way of computing lateness percentiles (the same answers)."""
    if request.param and not HAS_SKETCHES:
        pytest.skip("this pyspark has no KLL sketches")
    valid, malformed = read_events(spark, events_dir)
    assert malformed == 0
    yield build_tables(spark, valid, sketches=request.param)
    valid.unpersist()


def late(event: dict) -> float:
    return (event["ts"] - event["due_at"]) * 1000.0


def expected_stats(events):
    """The summary statistics of the fixture, written out by hand."""
    e = events
    return {
        A: {
            "scheduled": 4,
            "delivered": 5,
            "succeeded": 3,
            "retried": 4,
            "exhausted": 1,
            "parked": 1,
            "failed": 0,
            "replayed": 1,
            "cancelled": 0,
            # lateness A: a2_d1(-5) < a3_d0(2) < a1_d(10) < a2_d0(30) < a3_d1(100)
            "lateness_p50_ms": late(e["a1_d"]),
            "lateness_p99_ms": late(e["a3_d1"]),
            "early": 1,
            "success_after_retry_rate": 2 / 3,  # a2, a4 of a2, a3, a4
        },
        B: {
            "scheduled": 1,
            "delivered": 2,
            "succeeded": 3,
            "retried": 2,
            "exhausted": 0,
            "parked": 0,
            "failed": 1,
            "replayed": 0,
            "cancelled": 1,
            # lateness B: b3_d1(1) < b1_d(100)
            "lateness_p50_ms": late(e["b3_d1"]),
            "lateness_p99_ms": late(e["b1_d"]),
            "early": 0,
            "success_after_retry_rate": 1 / 2,  # b2 of b2, b3 (b3's success came first)
        },
        "overall": {
            "scheduled": 5,
            "delivered": 7,
            "succeeded": 6,
            "retried": 6,
            "exhausted": 1,
            "parked": 1,
            "failed": 1,
            "replayed": 1,
            "cancelled": 1,
            # -5, 1, 2, 10, 30, 100, 100: 4th smallest, largest
            "lateness_p50_ms": late(e["a1_d"]),
            "lateness_p99_ms": late(e["a3_d1"]),
            "early": 1,
            "success_after_retry_rate": 3 / 5,
        },
    }


COUNTS_DDL = (
    "scheduled bigint, delivered bigint, succeeded bigint, retried bigint, exhausted bigint, "
    "parked bigint, failed bigint, replayed bigint, cancelled bigint"
)
SUMMARY_DDL = (
    f"scope string, task_name string, {COUNTS_DDL}, lateness_p50_ms double, "
    "lateness_p99_ms double, early bigint, success_after_retry_rate double"
)


def test_task_summary(spark, tables, events):
    stats = expected_stats(events)
    rows = [
        ("task", A, *stats[A].values()),
        ("task", B, *stats[B].values()),
        ("overall", None, *stats["overall"].values()),
    ]
    assertDataFrameEqual(tables["task_summary"], spark.createDataFrame(rows, SUMMARY_DDL))


def test_queue_summary(spark, tables, events):
    stats = expected_stats(events)
    rows = [
        (queue, *[v for k, v in stats[task].items() if k != "success_after_retry_rate"])
        for queue, task in (("q", A), ("qb", B))
    ]
    ddl = f"queue string, {COUNTS_DDL}, lateness_p50_ms double, lateness_p99_ms double, early bigint"
    assertDataFrameEqual(tables["queue_summary"], spark.createDataFrame(rows, ddl))


def _approx_rank(values: list[float], q: float) -> float:
    """What percentile_approx returns for a handful of values: the ceil(q*n)-th smallest."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def test_timeline(spark, tables, events):
    from celery_delayq.analytics.tables import TIMELINE_EVENTS

    minutes: dict[int, dict] = defaultdict(lambda: {"lat": [], **{k: 0 for k in TIMELINE_EVENTS}})
    for e in events.values():
        m = minutes[int(e["ts"] // 60 * 60)]
        if e["event"] in TIMELINE_EVENTS:
            m[e["event"]] += 1
        if e["event"] == "delivered":
            m["lat"].append(late(e))
    expected = [
        (minute, *(m[k] for k in TIMELINE_EVENTS),
         _approx_rank(m["lat"], 0.5) if m["lat"] else None,
         _approx_rank(m["lat"], 0.99) if m["lat"] else None)
        for minute, m in minutes.items()
    ]
    ddl = ("minute_s bigint, " + ", ".join(f"{k} bigint" for k in TIMELINE_EVENTS)
           + ", lateness_p50_ms double, lateness_p99_ms double")
    assertDataFrameEqual(tables["timeline"], spark.createDataFrame(expected, ddl))
    assert {r.minute_s for r in tables["timeline"].collect()} >= {960, 1020, 2400}


def test_backlog_counts_ladder_passes_once(spark, tables):
    """A pass is a (task id, attempt) from its scheduling to its delivery or cancel.

    a3's second delivery, b1's delivery and b5's cancel have no scheduling in
    the data (a replay, or scheduled before the window): they are not passes,
    so the backlog never dips below zero.
    """
    rows = {r.minute_s: (r.entered, r.left) for r in tables["backlog"].collect()}
    assert rows == {960: (3, 2), 1020: (1, 2), 2160: (1, 1)}


def test_a_laps_leg_is_not_a_destination(spark, write_events, ev, tmp_path):
    """A delay longer than the ladder is scheduled into <prefix>.laps first, then to its queue."""
    lap = scheduled(ev, "long", 100.0, 5000.0, queue="shop.laps")
    final = scheduled(ev, "long", 4000.0, 1100.0, queue="orders")
    d = write_events([lap, final, delivered(ev, "long", 5100.01, 1100.0, 5100.0, queue="orders"),
                      ev("succeeded", "long", 5100.5, queue="orders")])
    summary = run_report(d, tmp_path / "out", spark=spark)
    assert set(summary["queues"]) == {"orders"}
    assert summary["overall"]["scheduled"] == 1 and summary["queues"]["orders"]["scheduled"] == 1
    passes = spark.read.parquet(str(tmp_path / "out" / "backlog")).collect()
    assert sorted((r.minute_s, r.entered, r.left) for r in passes) == [(60, 1, 0), (5100, 0, 1)]


def test_lateness_by_delay(spark, tables, events):
    e = events
    expected = [
        # bucket 0.0: zero delay (a3_d0)
        (0.0, 1, late(e["a3_d0"]), late(e["a3_d0"]), 0),
        # 0.0001 s is clamped into the smallest bucket
        (2.0**MIN_DELAY_BUCKET_EXP, 1, late(e["b3_d1"]), late(e["b3_d1"]), 0),
        # 2 s and 3 s share bucket 2.0
        (2.0, 2, late(e["a1_d"]), late(e["a3_d1"]), 0),
        (4.0, 1, late(e["b1_d"]), late(e["b1_d"]), 0),
        (8.0, 1, late(e["a2_d0"]), late(e["a2_d0"]), 0),
        (16.0, 1, late(e["a2_d1"]), late(e["a2_d1"]), 1),
    ]
    assertDataFrameEqual(
        tables["lateness_by_delay"],
        spark.createDataFrame(
            expected,
            "delay_bucket_s double, delivered bigint, lateness_p50_ms double, "
            "lateness_p99_ms double, early bigint",
        ),
    )


def test_retries_per_minute(spark, tables):
    actual = tables["retries_per_minute"]
    expected = [
        (A, 960, 1),  # a2 @1019
        (A, 1020, 2),  # a3 @1061, a4 @1070
        (A, 1080, 1),  # a3 @1125.5
        (B, 1980, 1),  # b2 @2010
        (B, 2160, 1),  # b3 @2200
    ]
    assertDataFrameEqual(
        actual, spark.createDataFrame(expected, "task_name string, minute_s bigint, retries bigint")
    )


EXC_DDL = (
    "task_name string, rank int, exception string, count bigint, retried bigint, exhausted bigint, "
    "parked bigint, failed bigint"
)


def test_top_exceptions_ranked_with_ties_by_name(spark, tables):
    expected = [
        # a3's last run is exhausted *and* parked: one failed run, counted once.
        (A, 1, "ConnectionError", 3, 2, 1, 1, 0),
        (A, 2, "TimeoutError", 2, 2, 0, 0, 0),
        (B, 1, "ValueError", 2, 1, 0, 0, 1),
        (B, 2, "KeyError", 1, 1, 0, 0, 0),
    ]
    assertDataFrameEqual(tables["top_exceptions"], spark.createDataFrame(expected, EXC_DDL))


def test_top_exceptions_limit(spark, events_dir):
    valid, _ = read_events(spark, events_dir)
    try:
        top1 = build_tables(spark, valid, top_exceptions=1)["top_exceptions"]
        assertDataFrameEqual(
            top1,
            spark.createDataFrame(
                [(A, 1, "ConnectionError", 3, 2, 1, 1, 0), (B, 1, "ValueError", 2, 1, 0, 0, 1)],
                EXC_DDL,
            ),
        )
    finally:
        valid.unpersist()


def test_attempts_to_success(spark, tables):
    expected = [(A, 0, 1), (A, 1, 2), (B, 0, 2), (B, 1, 1)]  # a1 | a2,a4 | b1,b3 | b2
    assertDataFrameEqual(
        tables["attempts_to_success"],
        spark.createDataFrame(expected, "task_name string, attempt bigint, count bigint"),
    )


def _reference_bucket(delay: float) -> float:
    """Exact power-of-two floor via frexp (no floating-point log)."""
    if delay <= 0:
        return 0.0
    _, exp = math.frexp(delay)  # delay = m * 2**exp, 0.5 <= m < 1
    return math.ldexp(1.0, max(exp - 1, MIN_DELAY_BUCKET_EXP))


def test_delay_bucket_exact_at_powers_of_two(spark):
    delays = [0.0, -3.0, 1e-9, 0.0001, 0.999999, 3.0, 1e6]
    for k in range(-12, 45):
        p = 2.0**k
        delays += [p, math.nextafter(p, 0.0), math.nextafter(p, math.inf), p * 1.5]
    frame = spark.createDataFrame([(d,) for d in delays], "delay_s double")
    actual = frame.select("delay_s", delay_bucket(F.col("delay_s")).alias("bucket"))
    expected = spark.createDataFrame(
        [(d, _reference_bucket(d)) for d in delays], "delay_s double, bucket double"
    )
    assertDataFrameEqual(actual, expected, rtol=0.0, atol=0.0)


def test_run_report_outputs(spark, events_dir, events, tmp_path):
    out = tmp_path / "report"
    summary = run_report(events_dir, out, spark=spark)

    stats = expected_stats(events)
    expected = {"overall": stats["overall"], "tasks": {A: stats[A], B: stats[B]}, "malformed": 0}
    assert set(summary) == {"overall", "tasks", "queues", "retry_storms", "malformed", "window", "live",
                            "timings_s"}
    assert summary["live"] is None  # no broker asked: the report says so instead of guessing
    assert list(summary["timings_s"]) == ["start Spark", "parse", "aggregate", "read back", "charts", "html"]
    assert summary["tasks"][A]["parked"] == 1 and summary["tasks"][B]["failed"] == 1
    assert summary["overall"]["parked"] == 1 and summary["overall"]["failed"] == 1
    assert summary["queues"]["qb"]["failed"] == 1 and summary["queues"]["q"]["parked"] == 1
    assert summary["retry_storms"] == []
    assert summary["tasks"].keys() == expected["tasks"].keys()
    for got, want in [
        (summary["overall"], expected["overall"]),
        *((summary["tasks"][t], expected["tasks"][t]) for t in (A, B)),
    ]:
        assert list(got) == list(want)  # field set and order
        assert got == pytest.approx(want)
    assert summary["malformed"] == 0
    assert json.loads((out / "summary.json").read_text()) == summary

    for name, n_rows in [
        ("task_summary", 3),
        ("queue_summary", 2),
        ("lateness_by_delay", 6),
        ("retries_per_minute", 5),
        ("top_exceptions", 4),
        ("attempts_to_success", 4),
        ("backlog", 3),
    ]:
        assert spark.read.parquet(str(out / name)).count() == n_rows, name

    from celery_delayq.analytics.plots import CHARTS

    for png in CHARTS:
        assert (out / png).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), png
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(CHARTS) == 5
    assert "Needs attention" in html and "Per queue" in html
    for external in ("http://", "https://", "<script", "<link"):
        assert external not in html
    assert A in html and "ConnectionError" in html

    spark.range(1).count()  # a caller's session is left running


def test_report_over_empty_tables(spark, write_events, ev, tmp_path):
    """Only first-try successes: no lateness, no retries, no exceptions."""
    d = write_events([ev("succeeded", "x", 100.0), ev("succeeded", "y", 200.0, attempt=0)])
    summary = run_report(d, tmp_path / "out", spark=spark)
    overall = summary["overall"]
    assert (overall["succeeded"], overall["retried"], overall["delivered"]) == (2, 0, 0)
    assert overall["lateness_p50_ms"] is None and overall["lateness_p99_ms"] is None
    assert overall["success_after_retry_rate"] is None
    assert spark.read.parquet(str(tmp_path / "out" / "retries_per_minute")).count() == 0
    assert (tmp_path / "out" / "retries_over_time.png").stat().st_size > 0


def test_reads_what_the_recorder_writes(spark, tmp_path):
    """Contract test: recorder output is parsed without loss."""
    root = tmp_path / "telemetry"
    sent = []
    with TelemetryRecorder(root, flush_every=4, flush_interval_s=3600) as rec:
        for i in range(10):
            base = 1_700_000_000.0 + i * 1800  # spans several hour partitions
            for event in (
                make_event(
                    "scheduled",
                    task_id=f"t{i}",
                    task_name="app.rec",
                    queue="q",
                    attempt=0,
                    ts=base,
                    delay_s=5.0,
                    due_at=base + 5,
                ),
                make_event(
                    "delivered",
                    task_id=f"t{i}",
                    task_name="app.rec",
                    queue="q",
                    attempt=0,
                    ts=base + 5.01,
                    delay_s=5.0,
                    due_at=base + 5,
                ),
                make_event(
                    "retried",
                    task_id=f"t{i}",
                    task_name="app.rec",
                    queue="q",
                    attempt=0,
                    ts=base + 6,
                    exception=RuntimeError("x"),
                ),
            ):
                rec.record(event)
                sent.append(event)
    assert len({p.parent for p in root.rglob("*.jsonl")}) > 1

    valid, malformed = read_events(spark, root)
    try:
        got = sorted((r.asDict() for r in valid.collect()), key=lambda r: (r["ts"], r["event"]))
    finally:
        valid.unpersist()
    assert malformed == 0
    want = [
        {
            k: e.get(k)
            for k in (
                "event",
                "task_id",
                "task_name",
                "queue",
                "attempt",
                "ts",
                "delay_s",
                "due_at",
                "exception",
            )
        }
        for e in sent
    ]
    assert got == sorted(want, key=lambda r: (r["ts"], r["event"]))


# -- synthetic generator ---------------------------------------------------------


def _lines(directory: Path) -> list[str]:
    return sorted(line for p in directory.glob("part-*") for line in p.read_text().splitlines())


def test_synthetic_exact_counts_and_deterministic(spark, tmp_path):
    stats = generate(tmp_path / "a", 5000, spark=spark, malformed=9, seed=7, tasks=3)
    assert stats == {"events": 5000, "malformed": 9, "files": 1}
    valid, malformed = read_events(spark, tmp_path / "a")
    try:
        assert (valid.count(), malformed) == (5000, 9)
        assert {r.task_name for r in valid.select("task_name").distinct().collect()} <= {
            "billing.charge_card",
            "email.send_welcome",
            "images.resize",
        }
    finally:
        valid.unpersist()
    generate(tmp_path / "b", 5000, spark=spark, seed=7, tasks=3)
    generate(tmp_path / "c", 5000, spark=spark, seed=8, tasks=3)
    assert _lines(tmp_path / "a") == _lines(tmp_path / "b")
    assert _lines(tmp_path / "a") != _lines(tmp_path / "c")


def test_synthetic_chains_follow_the_lifecycle(spark, tmp_path):
    generate(tmp_path / "s", 3000, spark=spark, seed=1)
    chains = defaultdict(list)
    for line in _lines(tmp_path / "s"):
        e = json.loads(line)
        chains[e["task_id"]].append(e)
    # "failed" either ends a single run (2) or follows an exhausted last attempt (2.5).
    phase = {"scheduled": 0, "delivered": 1, "retried": 2, "succeeded": 2, "exhausted": 2,
             "cancelled": 1, "failed": 2.5, "parked": 3, "replayed": 4}
    cut_short = 0  # the generator stops at exactly n events: one chain may end early
    for task_id, evs in chains.items():
        by_time = sorted(evs, key=lambda e: e["ts"])
        by_step = sorted(evs, key=lambda e: (e["attempt"], phase[e["event"]]))
        assert by_time == by_step, task_id
        assert all(
            e["event"] != "delivered" or e["ts"] >= e["due_at"] - 0.5 * e["delay_s"] for e in evs
        )
        last = max(e["attempt"] for e in evs)
        kinds = [e["event"] for e in evs]
        retried_late = any(e["event"] == "retried" and e["attempt"] == last for e in evs)
        cut_short += retried_late
        if "parked" in kinds or ("failed" in kinds and last > 0):
            assert "exhausted" in kinds, task_id
        if "replayed" in kinds:
            assert "parked" in kinds, task_id
    assert cut_short <= 1
    kinds = {e["event"] for evs in chains.values() for e in evs}
    assert kinds >= {"parked", "failed", "exhausted", "retried", "succeeded"}, kinds
