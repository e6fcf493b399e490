"""End to end: a real worker and the real ladder record telemetry; the Spark report counts it right."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from celery.bin.base import CLIContext

from celery_delayq import DelayedRetryTask
from celery_delayq.analytics import run_report
from celery_delayq.cli import delayq
from celery_delayq.telemetry import flush_all
from helpers import Collector, running_worker


def test_report_counts_match_what_happened(make_app, collector: Collector, tmp_path: Path, spark) -> None:
    events_dir = tmp_path / "events"
    app = make_app(delayq_telemetry_dir=str(events_dir))

    @app.task(base=DelayedRetryTask, bind=True)
    def steady(self) -> None:
        collector.add(task="steady", retries=self.request.retries)

    @app.task(base=DelayedRetryTask, bind=True, autoretry_for=(TimeoutError,), retry_backoff=False,
              default_retry_delay=0.2, max_retries=5)
    def flaky(self) -> None:
        collector.add(task="flaky", retries=self.request.retries)
        if self.request.retries < 2:
            raise TimeoutError("upstream slow")

    with running_worker(app):
        for _ in range(5):
            steady.apply_async(countdown=0.3)
        for _ in range(2):
            flaky.apply_async(countdown=0.2)
        runs = collector.wait_for(5 + 2 * 3, timeout=30)
    flush_all()

    summary = run_report(str(events_dir), str(tmp_path / "out"), spark=spark)
    overall = summary["overall"]
    ran = len(runs)
    assert overall["scheduled"] == ran  # every run came out of the ladder
    assert overall["delivered"] == ran
    assert overall["succeeded"] == 7
    assert overall["retried"] == 4
    assert overall["exhausted"] == 0
    assert overall["early"] == 0
    assert overall["success_after_retry_rate"] == 1.0
    assert summary["malformed"] == 0
    assert summary["tasks"][flaky.name]["retried"] == 4
    assert summary["tasks"][steady.name]["succeeded"] == 5
    assert 0 <= overall["lateness_p50_ms"] <= overall["lateness_p99_ms"] < 1000
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["overall"]["succeeded"] == 7
    assert "data:image/png;base64" in (tmp_path / "out" / "report.html").read_text()


def test_a_failure_and_what_waits_now(make_app, collector: Collector, tmp_path: Path, spark, uid: str) -> None:
    """A plain task that raises is a Celery FAILURE and the report counts it as one; a task still
    waiting in the ladder is in the report's first section, read from the broker."""
    events_dir = tmp_path / "events"
    app = make_app(delayq_telemetry_dir=str(events_dir), delayq_enabled=True, delayq_prefix=f"now{uid}")
    try:
        _failure_and_now(app, collector, events_dir, tmp_path, spark)
    finally:  # the ladder of its own, and the task that still waits in it
        delayq.main(["topology", "delete", "--yes", "--discard-messages"], obj=CLIContext(app=app, no_color=True,
                    workdir=None), standalone_mode=False)


def _failure_and_now(app, collector: Collector, events_dir: Path, tmp_path: Path, spark) -> None:
    from celery_delayq.analytics.command import live_state

    @app.task(bind=True)
    def breaks(self) -> None:
        collector.add(task="breaks")
        raise KeyError("template missing")

    @app.task
    def later() -> None:
        return None

    with running_worker(app):
        failing = breaks.apply_async(countdown=0.2)
        waiting = later.apply_async(countdown=600)
        collector.wait_for(1, timeout=30)
        deadline = time.time() + 10
        while not any(e.get("event") == "failed" for e in _recorded(events_dir)) and time.time() < deadline:
            flush_all()
            time.sleep(0.1)
    flush_all()

    now = live_state(app)
    assert "error" not in now and now["totals"]["waiting"] == 1
    summary = run_report(str(events_dir), str(tmp_path / "out"), spark=spark, live=now)
    task = summary["tasks"][breaks.name]
    assert (task["delivered"], task["failed"], task["parked"], task["succeeded"]) == (1, 1, 0, 0), failing.id
    assert summary["overall"]["scheduled"] == 2 and summary["overall"]["delivered"] == 1
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.index("Now, on the broker") < html.index("In the events of this window")
    assert ">1</div><div class=\"k\">waiting in the ladder" in html
    assert ">1</div><div class=\"k\">FAILURE (Celery)" in html
    assert ">1</div><div class=\"k\">still in the ladder at end" in html  # `later`, scheduled and not out
    assert summary["live"]["totals"]["waiting"] == 1 and waiting.id


def _recorded(root: Path) -> list[dict]:
    return [json.loads(line) for f in root.rglob("*.jsonl") for line in f.read_text().splitlines() if line.strip()]


#: The report reads files and one status; nothing here differs between RabbitMQ lines (the 3.10 leg runs it).
pytestmark = pytest.mark.one_broker
