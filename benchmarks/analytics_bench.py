"""Benchmark the telemetry analytics job (and the recorder's hot path).

Examples::

    python benchmarks/analytics_bench.py --events 1000000 10000000 --master local[2] \\
        --out benchmarks/results/analytics.json
    python benchmarks/analytics_bench.py --recorder-overhead --out benchmarks/results/recorder.json
    python benchmarks/analytics_bench.py --events 100M --standalone --out benchmarks/results/analytics-cluster.json

``--standalone`` runs the job on a Spark standalone cluster started on this
machine with pyspark's own ``bin/spark-class`` (pyspark has no
``start-master.sh``), exactly as one would by hand::

    SPARK_HOME=$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
    $SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master \\
        --host 127.0.0.1 --port 7077 --webui-port 8080 &
    $SPARK_HOME/bin/spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:7077 \\
        --host 127.0.0.1 --cores 2 --memory 10g --webui-port 8081 &
    python -m celery_delayq.analytics --events EVENTS --out REPORT \\
        --master spark://127.0.0.1:7077 --conf spark.executor.memory=9g

For every size, synthetic events are generated first (timed separately, in
this process), then the report job runs exactly as users run it — a fresh
``python -m celery_delayq.analytics`` process — so the job time includes JVM
start-up.  The generated files are flushed to disk before the first run (else
the kernel's write-back of gigabytes lands in it), and the job runs
``--repeat`` times (default 3): the median run is reported, with every run's
wall time.  Results go to a JSON file and a Markdown table on stdout.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import click

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

from celery_delayq.telemetry import TelemetryRecorder, make_event  # noqa: E402

_JVM_CPU = re.compile(r"driver jvm cpu ([\d.]+)s")


class EventCount(click.ParamType):
    """An event count: ``1000000``, ``1e6``, ``1M``, ``500k``; comma lists allowed."""

    name = "count"
    _SUFFIX: ClassVar[dict[str, int]] = {"k": 10**3, "m": 10**6, "g": 10**9}

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> list[int]:
        if isinstance(value, list):
            return value
        counts = []
        for item in str(value).split(","):
            text = item.strip().lower().replace("_", "")
            scale = self._SUFFIX.get(text[-1:], 1)
            if scale != 1:
                text = text[:-1]
            try:
                n = int(float(text) * scale)
            except ValueError:
                self.fail(f"{item!r} is not an event count", param, ctx)
            if n <= 0:
                self.fail(f"{item!r} must be positive", param, ctx)
            counts.append(n)
        return counts


# -- analytics job ------------------------------------------------------------


def _generate_all(sizes: list[int], work: Path, master: str) -> dict[int, float]:
    from celery_delayq.analytics.session import create_session
    from benchmarks.synthetic import generate

    spark = create_session(master, app_name="celery-delayq-bench-generate")
    seconds = {}
    try:
        for n in sizes:
            started = time.perf_counter()
            generate(work / f"events-{n}", n, spark=spark, malformed=100, overwrite=True)
            seconds[n] = time.perf_counter() - started
            click.echo(f"generated {n:,} events in {seconds[n]:.1f}s", err=True)
    finally:
        # Free the generator's JVM before the job starts its own.
        spark.stop()
    # Write the generated files out now: otherwise the kernel writes them back
    # (gigabytes) while the first job runs, and that job pays for the generator.
    started = time.perf_counter()
    os.sync()
    click.echo(f"flushed the generated files to disk in {time.perf_counter() - started:.1f}s", err=True)
    return seconds


def _run_job(n: int, work: Path, master: str, conf: tuple[str, ...] = ()) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
        ),
    }
    out = work / f"report-{n}"
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_delayq.analytics",
            "-v",
            "--events",
            str(work / f"events-{n}"),
            "--out",
            str(out),
            "--master",
            master,
            *(arg for item in conf for arg in ("--conf", item)),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise click.ClickException(f"job failed for {n:,} events:\n{proc.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    # The job's own stage clock (summary.json ``timings_s``); Spark start-up is outside parse and aggregates.
    stages = summary.get("timings_s") or {}
    parse_s, agg_s = stages.get("parse"), stages.get("aggregate")
    in_job_s = round(sum(v for k, v in stages.items() if k != "start Spark"), 2) if stages else None
    from celery_delayq.telemetry import EVENT_TYPES

    counted = sum(summary["overall"][k] for k in EVENT_TYPES)
    cpu = _JVM_CPU.search(proc.stderr)
    click.echo(f"report for {n:,} events in {wall:.1f}s", err=True)
    return {
        "job_wall_s": round(wall, 2),
        "job_parse_cache_s": parse_s,
        "job_aggregates_s": agg_s,
        "job_in_session_s": in_job_s,
        "job_spark_start_s": stages.get("start Spark"),
        # CPU of the driver JVM (all of the work on local[N]): other load on the
        # machine stretches the wall time, much less this.
        "job_driver_jvm_cpu_s": float(cpu.group(1)) if cpu else None,
        "events_counted": counted,
        "malformed_counted": summary["malformed"],
        "report_dir": str(out),
    }


SPARK_CLASS = "bin/spark-class"


class Standalone:
    """A Spark standalone master and one worker on this machine, via pyspark's ``bin/spark-class``."""

    def __init__(self, cores: int, memory: str, port: int = 7077) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.url = f"spark://127.0.0.1:{port}"
        self.port, self.cores, self.memory = port, cores, memory
        self.procs: list[subprocess.Popen[bytes]] = []

    def commands(self) -> list[list[str]]:
        spark_class = str(self.home / SPARK_CLASS)
        return [
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", "18080"],
            [spark_class, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
             "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "18081"],
        ]

    def __enter__(self) -> Standalone:
        import socket

        env = {**os.environ, "SPARK_HOME": str(self.home)}
        master, worker = self.commands()
        self.procs.append(subprocess.Popen(master, env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
        deadline = time.time() + 60
        while True:  # the master listens before the worker may register
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise click.ClickException("the Spark master did not start within 60 s")
                time.sleep(0.5)
        self.procs.append(subprocess.Popen(worker, env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
        time.sleep(8)  # the worker registers with the master
        click.echo("standalone cluster: " + " && ".join(" ".join(c) for c in self.commands()), err=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def bench_analytics(sizes: list[int], master: str, work: Path, job_conf: tuple[str, ...] = (),
                    generate_master: str | None = None, repeat: int = 1) -> list[dict[str, Any]]:
    """Generate each size, then run the job ``repeat`` times on it: the median run is
    reported, with every run's wall time (one run on a shared machine is weak evidence)."""
    gen_seconds = _generate_all(sizes, work, generate_master or master)
    results = []
    for n in sizes:
        runs = [_run_job(n, work, master, job_conf) for _ in range(max(1, repeat))]
        job = sorted(runs, key=lambda r: r["job_wall_s"])[(len(runs) - 1) // 2]  # the median run
        job = {**job, "job_wall_runs_s": [r["job_wall_s"] for r in runs],
               "job_wall_max_s": max(r["job_wall_s"] for r in runs)}
        events_bytes = sum(
            f.stat().st_size for f in (work / f"events-{n}").iterdir() if f.is_file()
        )
        results.append(
            {
                "events": n,
                "input_mb": round(events_bytes / 2**20, 1),
                "generate_s": round(gen_seconds[n], 2),
                **job,
                "events_per_s": round(n / job["job_wall_s"]),
            }
        )
    return results


# -- recorder ------------------------------------------------------------------


def bench_recorder(n: int, work: Path) -> dict[str, Any]:
    """Caller-side cost of record() and the writer's sustained throughput."""
    event = make_event(
        "delivered",
        task_id="0b7a8a3e-5e1f-4c1e-9d53-2f4f7c1e9a10",
        task_name="app.tasks.send_email",
        queue="email",
        attempt=0,
        delay_s=30.0,
        due_at=time.time(),
    )

    def loop_baseline() -> float:
        def noop(_: Any) -> None:
            return None

        started = time.perf_counter()
        for _ in range(n):
            noop(event)
        return time.perf_counter() - started

    # 1. Hot path with default settings (what a worker pays per event).
    rec = TelemetryRecorder(work / "rec-default")
    started = time.perf_counter()
    for _ in range(n):
        rec.record(event)
    record_s = time.perf_counter() - started
    rec.close()
    default_written, default_dropped = rec.written, rec.dropped

    # 2. Building the event too (make_event + record).
    rec = TelemetryRecorder(work / "rec-make", max_buffer=n)
    started = time.perf_counter()
    for _ in range(n):
        rec.record(
            make_event(
                "succeeded",
                task_id="0b7a8a3e-5e1f-4c1e-9d53-2f4f7c1e9a10",
                task_name="app.tasks.send_email",
                queue="email",
                attempt=0,
            )
        )
    make_record_s = time.perf_counter() - started
    rec.close()

    # 3. Sustained end-to-end throughput: record everything, then drain to disk.
    rec = TelemetryRecorder(work / "rec-drain", max_buffer=n)
    started = time.perf_counter()
    for _ in range(n):
        rec.record(event)
    rec.close()
    drain_s = time.perf_counter() - started
    assert rec.written == n and rec.dropped == 0, (rec.written, rec.dropped)

    baseline_s = loop_baseline()
    return {
        "events": n,
        "record_us_per_event": round(record_s / n * 1e6, 3),
        "record_net_us_per_event": round((record_s - baseline_s) / n * 1e6, 3),
        "make_event_and_record_us_per_event": round(make_record_s / n * 1e6, 3),
        "loop_baseline_us_per_event": round(baseline_s / n * 1e6, 3),
        "default_config_written": default_written,
        "default_config_dropped": default_dropped,
        "sustained_events_per_s": round(n / drain_s),
        "bytes_per_event": round(
            sum(p.stat().st_size for p in (work / "rec-drain").rglob("*.jsonl")) / n, 1
        ),
    }


# -- output ----------------------------------------------------------------------


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---:|" * len(headers),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _markdown(analytics: list[dict[str, Any]], recorder: dict[str, Any] | None, master: str) -> str:
    lines: list[str] = []
    if analytics:
        lines += [f"Analytics job (`--master {master}`, {os.cpu_count()} CPUs):", ""]
        lines += _md_table(
            [
                "events",
                "input",
                "generate",
                "job (wall, incl. JVM start; median)",
                "runs",
                "parse+cache",
                "aggregates",
                "events/s",
            ],
            [
                [
                    f"{r['events']:,}",
                    f"{r['input_mb']:,} MiB",
                    f"{r['generate_s']:.1f} s",
                    f"{r['job_wall_s']:.1f} s",
                    ", ".join(f"{s:.1f}" for s in r.get("job_wall_runs_s", [r["job_wall_s"]])) + " s",
                    f"{r['job_parse_cache_s']} s",
                    f"{r['job_aggregates_s']} s",
                    f"{r['events_per_s']:,}",
                ]
                for r in analytics
            ],
        )
    if recorder:
        lines += ["", f"Recorder ({recorder['events']:,} events, tight loop):", ""]
        lines += _md_table(
            [
                "record()",
                "make_event()+record()",
                "loop baseline",
                "writer throughput",
                "dropped (default max_buffer)",
            ],
            [
                [
                    f"{recorder['record_us_per_event']} µs",
                    f"{recorder['make_event_and_record_us_per_event']} µs",
                    f"{recorder['loop_baseline_us_per_event']} µs",
                    f"{recorder['sustained_events_per_s']:,} ev/s",
                    f"{recorder['default_config_dropped']:,}",
                ]
            ],
        )
    return "\n".join(lines)


def _save_report(analytics: list[dict[str, Any]], target: Path) -> None:
    """Copy the largest run's charts, HTML and summary (e.g. for the README)."""
    source = Path(max(analytics, key=lambda r: r["events"])["report_dir"])
    target.mkdir(parents=True, exist_ok=True)
    from celery_delayq.analytics.plots import CHARTS

    for name in ("report.html", "summary.json", *CHARTS):
        shutil.copy2(source / name, target / name)


@click.command()
@click.option(
    "--events",
    "event_opts",
    type=EventCount(),
    multiple=True,
    help="Event counts to benchmark (repeatable or comma-separated: 1M,10M).",
)
@click.argument("more_events", nargs=-1, type=EventCount())
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=REPO_ROOT / "benchmarks" / "results" / "analytics.json",
    show_default=True,
    help="JSON results file.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to put generated events and reports (default: a temp dir).",
)
@click.option("--keep", is_flag=True, help="Keep the work dir (events and reports).")
@click.option(
    "--save-report",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Copy the largest run's report.html, summary.json and PNGs here.",
)
@click.option("--standalone", is_flag=True,
              help="Run the job on a Spark standalone cluster (master + worker) started here "
              "with pyspark's bin/spark-class.")
@click.option("--worker-memory", default="10g", show_default=True, help="--standalone worker memory.")
@click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Runs of the job per size; the median run is reported, with all runs' times.")
@click.option("--recorder-overhead", is_flag=True, help="Also measure the recorder's hot path.")
@click.option(
    "--recorder-events",
    type=EventCount(),
    default="1000000",
    show_default=True,
    help="Events for --recorder-overhead.",
)
def main(
    event_opts: tuple[list[int], ...],
    more_events: tuple[list[int], ...],
    master: str,
    out_path: Path,
    work_dir: Path | None,
    keep: bool,
    save_report: Path | None,
    standalone: bool,
    worker_memory: str,
    repeat: int,
    recorder_overhead: bool,
    recorder_events: list[int],
) -> None:
    """Benchmark the analytics job; extra positional counts are accepted so
    that ``--events 1000000 10000000`` works."""
    sizes = sorted({n for group in (*event_opts, *more_events) for n in group})
    if not sizes and not recorder_overhead:
        raise click.UsageError("nothing to do: give --events and/or --recorder-overhead")
    work = Path(work_dir or tempfile.mkdtemp(prefix="delayq-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if standalone and sizes:
            cores = os.cpu_count() or 2
            executor_memory = f"{max(1, int(worker_memory.rstrip('gG')) - 1)}g"
            with Standalone(cores, worker_memory) as cluster:
                master = cluster.url
                analytics = bench_analytics(
                    sizes, master, work, (f"spark.executor.memory={executor_memory}",),
                    generate_master=f"local[{cores}]", repeat=repeat,
                )
        else:
            analytics = bench_analytics(sizes, master, work, repeat=repeat) if sizes else []
        recorder = bench_recorder(recorder_events[0], work) if recorder_overhead else None
        if save_report and analytics:
            _save_report(analytics, save_report)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if not keep:
        for run in analytics:
            del run["report_dir"]  # deleted with the work dir

    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "master": master,
        "analytics": analytics,
        "recorder": recorder,
    }
    try:
        import pyspark

        result["machine"]["pyspark"] = pyspark.__version__
    except ImportError:
        pass
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(_markdown(analytics, recorder, master))
    click.echo(f"\nresults: {out_path}" + (f"; work dir: {work}" if keep else ""))


if __name__ == "__main__":
    main()
