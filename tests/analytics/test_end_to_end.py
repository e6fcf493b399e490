"""End to end: a real worker and the real ladder record telemetry; the Spark report counts it right."""

from __future__ import annotations

import json
from pathlib import Path

from celery_delayq import DelayedRetryTask
from celery_delayq.analytics import run_report
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
