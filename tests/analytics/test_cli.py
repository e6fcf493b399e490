"""``python -m celery_delayq.analytics``: one real subprocess run, plus
in-process checks of the error paths (no extra JVM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import celery_delayq.analytics
from celery_delayq.analytics.cli import report_command
from celery_delayq.analytics.synthetic import generate
from celery_delayq.analytics.tables import TABLE_NAMES

REPO_ROOT = Path(celery_delayq.analytics.__file__).resolve().parents[2]


def test_cli_end_to_end_subprocess(spark, tmp_path):
    events, out = tmp_path / "events", tmp_path / "out"
    generate(events, 2000, spark=spark, malformed=3, tasks=4, seed=5)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
        ),
    }
    env.setdefault("SPARK_DRIVER_MEMORY", "1g")  # keep the test JVM small
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_delayq.analytics",
            "--events",
            str(events),
            "--out",
            str(out),
            "--master",
            "local[1]",
            "--conf",
            "spark.sql.shuffle.partitions=1",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "report.html" in result.stdout and "malformed lines: 3" in result.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["malformed"] == 3
    overall = summary["overall"]
    assert (
        sum(overall[k] for k in ("scheduled", "delivered", "succeeded", "retried", "exhausted"))
        == 2000
    )
    assert 1 <= len(summary["tasks"]) <= 4

    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    for png in ("lateness_by_delay.png", "retries_over_time.png", "attempts_to_success.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    for name in TABLE_NAMES:
        assert spark.read.parquet(str(out / name)).count() > 0, name
    assert spark.read.parquet(str(out / "task_summary")).count() == len(summary["tasks"]) + 1


def test_cli_missing_events_dir(tmp_path):
    result = CliRunner().invoke(
        report_command, ["--events", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 1
    assert "events directory not found" in result.output


def test_cli_no_valid_events(spark, tmp_path):
    # The test session is active in this process, so the command reuses it.
    events = tmp_path / "events"
    events.mkdir()
    (events / "x.jsonl").write_text("garbage\n{}\n")
    result = CliRunner().invoke(
        report_command, ["--events", str(events), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 1
    assert "no valid events" in result.output and "2 malformed" in result.output
    spark.range(1).count()  # and leaves it running


def test_cli_rejects_bad_conf(tmp_path):
    result = CliRunner().invoke(
        report_command,
        ["--events", str(tmp_path), "--out", str(tmp_path / "out"), "--conf", "no-equals-sign"],
    )
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.output
