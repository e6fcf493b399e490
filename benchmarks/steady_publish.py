"""Steady traffic with one countdown: what each backend costs the publisher and the broker, and how many queues
it leaves alive.

    python benchmarks/steady_publish.py                 # countdown 300 s, 5 publisher processes of 8 s each
    DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=.venv/rmq4-bin:$PATH python benchmarks/steady_publish.py

The case: an app that calls ``apply_async(countdown=300)`` at a steady rate from several processes one after
another (web workers restarting, a cron of short-lived publishers), each in ``celery_delayq.batch()`` blocks of
200. Per setting, in one vhost of its own on the benchmark broker (:mod:`benchmarks.common`), deleted afterwards:

* ``default``: the default backend (``buckets``, with recurring delays);
* ``buckets_no_recurring``: the same with ``delayq_recurring_after = 0``, which is what the default did with a
  long countdown before recurring delays covered delays of ``delayq_bucket_min_delay`` and over: a set of
  due-time buckets for every second the publishing lasts;
* ``ladder``: ``delayq_backend = "ladder"``.

Per process: calls per second, the broker's CPU per call over the process's life (``/proc`` of the node), and
the queues in the vhost after it. One setting at a time, its vhost deleted before the next: on RabbitMQ 3.x
the queues one setting leaves alive take file handles every other queue on the broker needs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (REPO_ROOT as ROOT, RESULTS_DIR as RESULTS, broker_pid,  # noqa: E402
                               broker_version, cpu_s_of, rabbitmqctl, script_argv, vhost, write_line_results)

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "buckets_no_recurring": {"delayq_recurring_after": 0},
    "ladder": {"delayq_backend": "ladder"},
}

_CHILD = r'''
import json, sys, time
from celery import Celery
import celery_delayq
url, countdown, seconds, settings = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
app = Celery("steady", broker=url, set_as_current=False)
app.conf.update(delayq_enabled=True, delayq_prefix="steady", task_default_queue="steady", **settings)

@app.task(name="steady.noop")
def noop(x):
    return x

start, n = time.perf_counter(), 0
while time.perf_counter() - start < seconds:
    with celery_delayq.batch(app):
        for _ in range(200):
            noop.apply_async((1,), countdown=countdown)
    n += 200
print(json.dumps({"calls": n, "rate": round(n / (time.perf_counter() - start), 1)}))
'''


def queue_count(name: str) -> int:
    """Queues in vhost ``name``."""
    return len([line for line in rabbitmqctl("list_queues", "-p", name, "name", "--no-table-headers").splitlines()
                if line.strip()])


def markdown(doc: dict[str, Any]) -> str:
    """The committed table (pure): per setting, each process's rate, the median broker CPU per call, the queues."""
    lines = [f"# Steady traffic with one countdown ({doc['broker']}, {doc['when']})", "",
             f"`{doc['argv']}`: {doc['processes']} publisher processes per setting, one after another "
             f"(one setting at a time, its vhost deleted before the next), each {doc['seconds']:g} s of "
             f"`apply_async(countdown={doc['countdown']:g})` in `batch()` blocks of 200.", "",
             "| setting | calls/s, each process | median | broker CPU µs per call (median) | queues alive after each "
             "process |", "|---|---|---|---|---|"]
    for name in doc["settings"]:
        rows = [r for r in doc["runs"] if r["setting"] == name]
        rates = [r["rate"] for r in rows]
        cpu = [r["broker_cpu_us"] for r in rows if r.get("broker_cpu_us") is not None]
        cpu_text = f"{statistics.median(cpu):,.0f}" if cpu else "-"
        lines.append(f"| {name} | {', '.join(f'{x:,.0f}' for x in rates)} | {statistics.median(rates):,.0f} | "
                     f"{cpu_text} | {', '.join(str(r['queues']) for r in rows)} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--countdown", default=300.0, show_default=True, help="Seconds: every call's countdown.")
@click.option("--processes", default=5, show_default=True, help="Publisher processes per setting.")
@click.option("--seconds", default=8.0, show_default=True, help="How long each process publishes.")
@click.option("--settings", "names", default=",".join(SETTINGS), show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(countdown: float, processes: int, seconds: float, names: str, out: Path) -> None:
    """Run each setting's publishers, one setting at a time; write steady_publish.md and .json under --out."""
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in SETTINGS]
    if unknown:
        raise click.BadParameter(f"unknown: {', '.join(unknown)} (known: {', '.join(SETTINGS)})",
                                 param_hint="--settings")
    runs: list[dict[str, Any]] = []
    pid = broker_pid()
    for name in chosen:  # one setting at a time: its queues, not another's, load the broker (3.x: file handles)
        with vhost(f"steady-{name.replace('_', '-')}") as vh:
            for k in range(processes):
                before = cpu_s_of(pid)
                done = subprocess.run([sys.executable, "-c", _CHILD, vh.url, str(countdown), str(seconds),
                                       json.dumps(SETTINGS[name])], capture_output=True, text=True, timeout=600,
                                      cwd=ROOT)
                after = cpu_s_of(pid)
                if done.returncode:
                    raise click.ClickException(f"{name} failed: {done.stderr[-2000:]}")
                run = {"setting": name, "process": k, **json.loads(done.stdout.strip().splitlines()[-1]),
                       "queues": queue_count(vh.name)}
                if before is not None and after is not None:
                    run["broker_cpu_us"] = round((after - before) / run["calls"] * 1e6, 1)
                runs.append(run)
                click.echo(f"  {run}", err=True)
    broker = broker_version()
    doc = {"when": time.strftime("%Y-%m-%d"), "broker": broker, "countdown": countdown, "processes": processes,
           "seconds": seconds, "settings": chosen, "runs": runs, "argv": script_argv("benchmarks/steady_publish.py")}
    write_line_results(out, "steady_publish", doc, markdown(doc))


if __name__ == "__main__":
    main()
