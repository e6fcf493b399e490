"""``python -m celery_delayq.analytics``: one real subprocess run, plus
in-process checks of the error paths (no extra JVM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from click.testing import CliRunner

import celery_delayq.analytics
from celery_delayq.analytics.command import report_command
from celery_delayq.analytics.plots import CHARTS
from celery_delayq.analytics.schema import EVENT_TYPES
from benchmarks.synthetic import generate
from celery_delayq.analytics.tables import TABLE_NAMES
from celery_delayq.options import Moment

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
    assert sum(overall[k] for k in EVENT_TYPES) == 2000
    assert 1 <= len(summary["tasks"]) <= 4

    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(CHARTS)
    for png in CHARTS:
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


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    }


@pytest.mark.parametrize("kind", ["empty", "missing", "only empty files"])
def test_nothing_to_report_is_answered_in_under_two_seconds(tmp_path, kind):
    """A cron run over an empty or missing directory must not wait for a JVM."""
    events = tmp_path / "events"
    if kind != "missing":
        events.mkdir()
    if kind == "only empty files":
        (events / "date=2026-01-01" / "hour=00").mkdir(parents=True)
        (events / "date=2026-01-01" / "hour=00" / "events-x.jsonl").write_text("")
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "celery_delayq.analytics", "--events", str(events), "--out",
         str(tmp_path / "out")],
        cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=60,
    )
    elapsed = time.perf_counter() - started
    assert result.returncode == 1
    assert ("not found" if kind == "missing" else "nothing to report") in result.stderr
    assert elapsed < 2.0, f"took {elapsed:.2f} s"
    assert "pyspark" not in result.stderr.lower()


def _app_module(tmp_path: Path, telemetry_dir: Path | None) -> str:
    name = f"reportapp_{abs(hash(str(tmp_path))) % 10**8}"
    setting = f"delayq_telemetry_dir={str(telemetry_dir)!r}" if telemetry_dir else ""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        app = Celery("reportapp", broker="memory://", set_as_current=False)
        app.conf.update({setting})
    """))
    return name


def test_events_default_to_the_apps_telemetry_dir(tmp_path, monkeypatch):
    telemetry = tmp_path / "telemetry"
    telemetry.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _app_module(tmp_path, telemetry)
    result = CliRunner().invoke(report_command, ["-A", f"{module}:app", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert f"no telemetry events under {telemetry}" in result.output  # read from the app's setting


def test_celery_delayq_report_reads_the_app_setting(tmp_path):
    """Through Celery's own CLI: ``celery -A APP delayq report`` with no --events."""
    telemetry = tmp_path / "telemetry"
    telemetry.mkdir()
    module = _app_module(tmp_path, telemetry)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), env["PYTHONPATH"]))
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", f"{module}:app", "delayq", "report", "--out",
         str(tmp_path / "o")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert f"no telemetry events under {telemetry}" in result.stderr + result.stdout, result.stderr


def test_no_events_dir_and_no_app_says_what_to_give(tmp_path):
    result = CliRunner().invoke(report_command, ["--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--events DIR" in result.output


def test_an_app_without_telemetry_says_so(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _app_module(tmp_path, None)
    result = CliRunner().invoke(report_command, ["-A", f"{module}:app"])
    assert result.exit_code == 2 and "delayq_telemetry_dir" in result.output


def test_time_param():
    param = Moment("ago")  # what report's --since/--until take
    assert param.convert("2024-01-01T00:00:00Z", None, None) == 1704067200.0
    assert param.convert("2024-01-01T01:00", None, None) == 1704070800.0  # UTC unless it says
    assert param.convert("1704067200", None, None) == 1704067200.0
    assert abs(param.convert("6h", None, None) - (time.time() - 6 * 3600)) < 5
    assert abs(param.convert("90m", None, None) - (time.time() - 5400)) < 5
    with pytest.raises(Exception, match="not a time"):
        param.convert("yesterday-ish", None, None)


def test_since_must_come_before_until(tmp_path):
    result = CliRunner().invoke(report_command, ["--events", str(tmp_path), "--since", "2024-01-02",
                                                 "--until", "2024-01-01"])
    assert result.exit_code == 2 and "--since must be before --until" in result.output
