"""The report's numbers are right (issue #31, item 5): each failed run counted once, each delay
filed in the bucket of the delay that was asked for.

Two bugs these pin: "Top exceptions" summed every failure event, so a run whose retries ran out
(``exhausted`` and ``parked`` for the same failure) counted twice, and a task that always fails
with ``max_retries=3`` showed 5 for its 4 failed runs; "Lateness by requested delay" bucketed the
recorded delay, which is measured at the publish, a moment after the countdown was set
(``countdown=2`` is recorded as 1.9998), so ``countdown=2`` was filed under "1 s" and
``countdown=1`` under "500 ms".
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retry_helpers import parking_name_fixture  # noqa: F401  (fixture)

from celery_delayq.analytics import build_tables, read_events, run_report
from benchmarks.synthetic import generate
from celery_delayq.analytics.tables import RUN_FAILURES

Event = dict[str, Any]


def _delivered(ev: Callable[..., Event], task_id: str, delay: float, *, at: float = 10_000.0,
               late: float = 0.004) -> Event:
    """A delivery whose recorded delay is ``delay``, ``late`` seconds after it was due."""
    return ev("delivered", task_id, at + late, delay_s=delay, due_at=at, task="hand.timer")


def _failed_run(ev: Callable[..., Event], event: str, task: str, task_id: str, attempt: int,
                exception: str) -> Event:
    return ev(event, task_id, 20_000.0 + attempt, task=task, attempt=attempt, exception=exception)


def _hand_failures(ev: Callable[..., Event]) -> list[Event]:
    """Failure events as the worker records them, for four ways a run fails for good."""
    parked = [_failed_run(ev, "retried", "hand.parked", "p1", a, "ConnectionError") for a in range(3)]
    # max_retries=3: the fourth run is exhausted and parked, one failure recorded twice.
    parked += [_failed_run(ev, kind, "hand.parked", "p1", 3, "ConnectionError")
               for kind in ("exhausted", "parked")]
    # Parking off: exhausted and failed (Celery's FAILURE), again one failure.
    gave_up = [_failed_run(ev, "retried", "hand.gives_up", "g1", 0, "TimeoutError")]
    gave_up += [_failed_run(ev, kind, "hand.gives_up", "g1", 1, "TimeoutError") for kind in ("exhausted", "failed")]
    # self.retry() without exc: the exhausted event names no exception, the parking names Celery's.
    no_exc = [_failed_run(ev, "exhausted", "hand.no_exc", "n1", 1, ""),
              _failed_run(ev, "parked", "hand.no_exc", "n1", 1, "MaxRetriesExceededError")]
    # delayq_park_on: parked at once, no exhaustion; a plain task: failed, nothing else.
    once = [_failed_run(ev, "parked", "hand.park_on", "o1", 0, "ValueError"),
            _failed_run(ev, "failed", "hand.plain", "x1", 0, "KeyError")]
    return parked + gave_up + no_exc + once


def _recorded(root: Path) -> list[Event]:
    return [json.loads(line) for f in sorted(root.rglob("*")) if f.is_file() and not f.name.startswith((".", "_"))
            for line in f.read_text().splitlines() if line.strip().startswith("{")]


def _failed_runs(events: list[Event]) -> dict[tuple[str, str], int]:
    """Failed runs per (task, exception), counted from the events themselves: one per run."""
    return dict(Counter((e["task_name"], e["exception"]) for e in events if e["event"] in RUN_FAILURES))


def test_top_exceptions_count_each_failed_run_once(spark, ev, tmp_path: Path, write_events) -> None:
    """Synthetic chains (retried, exhausted then parked or failed, replayed) and hand-made ones:
    every ``count`` is the runs that failed, never an exhausted run twice."""
    root = tmp_path / "events"
    # Eight tasks: the sixth, webhooks.deliver, fails 55% of its runs, so some run out of retries.
    generate(root / "synthetic", 4000, spark=spark, seed=3, tasks=8, incident=False)
    synthetic = Counter(e["event"] for e in _recorded(root / "synthetic"))
    assert synthetic["exhausted"] >= 3 and synthetic["parked"] >= 2, synthetic  # runs the old sum counted twice
    write_events(_hand_failures(ev), name="events/hand")
    events = _recorded(root)
    valid, _ = read_events(spark, root)
    try:
        rows = {(r.task_name, r.exception): r.asDict() for r in build_tables(spark, valid)["top_exceptions"].collect()}
    finally:
        valid.unpersist()
    assert {key: row["count"] for key, row in rows.items()} == _failed_runs(events)
    for row in rows.values():
        assert row["count"] == row["retried"] + row["parked"] + row["failed"] >= row["exhausted"], row
    fields = ("count", "retried", "exhausted", "parked", "failed")
    assert tuple(rows["hand.parked", "ConnectionError"][f] for f in fields) == (4, 3, 1, 1, 0)
    assert tuple(rows["hand.gives_up", "TimeoutError"][f] for f in fields) == (2, 1, 1, 0, 1)
    assert tuple(rows["hand.no_exc", "MaxRetriesExceededError"][f] for f in fields) == (1, 0, 0, 1, 0)
    assert ("hand.no_exc", "") not in rows  # an exhaustion whose run is counted under its parking
    assert rows["hand.park_on", "ValueError"]["count"] == rows["hand.plain", "KeyError"]["count"] == 1


def test_lateness_by_delay_files_the_delay_that_was_asked_for(spark, ev, write_events) -> None:
    recorded = {
        # what a person asked for -> what the worker recorded (the publish came a moment later)
        "countdown=1": 0.9998, "countdown=2": 1.9998, "countdown=2, 30 ms later": 1.97,
        "countdown=0.5": 0.4999, "countdown=64": 63.9995, "exactly 2": 2.0,
        # delays that are not short of a bucket stay where they are
        "1.5 s": 1.5, "1.9 s": 1.9, "0.47 s": 0.47, "1000 s": 1000.0, "5 ms": 0.005, "zero": 0.0,
        # more than 50 ms short of 2 s is not a lag: a delay of its own
        "1.94 s": 1.94,
    }
    d = write_events([_delivered(ev, name, delay) for name, delay in recorded.items()])
    valid, _ = read_events(spark, d)
    try:
        rows = build_tables(spark, valid)["lateness_by_delay"].collect()
    finally:
        valid.unpersist()
    assert {r.delay_bucket_s: r.delivered for r in rows} == {
        0.0: 1, 2.0**-8: 1, 0.25: 1, 0.5: 1, 1.0: 4, 2.0: 3, 64.0: 1, 512.0: 1,
    }


# -- a real worker on the real broker ----------------------------------------------------------


def test_a_real_worker_s_failures_and_delays_in_the_report(make_app, collector, tmp_path: Path, spark,
                                                           parking_name: str) -> None:
    """A task that always fails with ``max_retries=3`` is 4 failed runs in Top exceptions (3 retried,
    the last exhausted and parked); ``countdown=1`` and ``countdown=2`` are in the 1 s and 2 s buckets."""
    from celery_delayq import DelayedRetryTask
    from celery_delayq.telemetry import flush_all
    from helpers import running_worker

    events_dir = tmp_path / "events"
    app = make_app(delayq_telemetry_dir=str(events_dir), delayq_parking_queue=parking_name,
                   delayq_parking_queue_type="classic")

    @app.task(base=DelayedRetryTask, bind=True, max_retries=3, default_retry_delay=0.2)
    def always_fails(self: Any) -> None:
        collector.add(task="always_fails")
        raise self.retry(exc=ConnectionError("down"))

    @app.task(base=DelayedRetryTask)
    def on_time() -> None:
        collector.add(task="on_time")

    with running_worker(app):
        # The process's first publish also connects (5 ms here): not what this test is about.
        on_time.delay()
        always_fails.apply_async(countdown=1)
        for countdown in (1, 1, 2, 2):
            on_time.apply_async(countdown=countdown)
        collector.wait_for(1 + 4 + 4, timeout=30)
        deadline = time.time() + 10  # the parking (and its event) follows the last run's body
        while not any(e["event"] == "parked" for e in _recorded(events_dir)) and time.time() < deadline:
            flush_all()
            time.sleep(0.1)
    flush_all()

    summary = run_report(str(events_dir), str(tmp_path / "out"), spark=spark)
    assert summary["tasks"][always_fails.name]["parked"] == 1, summary["tasks"]
    out = tmp_path / "out"
    top = spark.read.parquet(str(out / "top_exceptions")).collect()
    assert [(r.task_name, r.exception, r["count"], r.retried, r.exhausted, r.parked, r.failed) for r in top] == [
        (always_fails.name, "ConnectionError", 4, 3, 1, 1, 0)]
    buckets = {r.delay_bucket_s: r.delivered for r in spark.read.parquet(str(out / "lateness_by_delay")).collect()}
    # always_fails' first run and two on_time runs at 1 s, two at 2 s; the three retries at 0.2 s.
    assert buckets == {1.0: 3, 2.0: 2, 0.125: 3}, buckets
