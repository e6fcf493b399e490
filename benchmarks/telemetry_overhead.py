"""Telemetry recording overhead, as a share of task throughput, in a real Celery worker.

    python benchmarks/telemetry_overhead.py --tasks 3000 --rounds 3

Runs the same workload (delayed publishes through the ladder, then the tasks
in a solo worker) with ``delayq_telemetry_dir`` off and on, alternating
rounds in one process so machine noise hits both sides alike, and reports
tasks/s and the ratio. Every run records scheduled, delivered and succeeded
events, so this is the full per-task cost of recording.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid

import click
from celery import Celery
from celery.contrib.testing.worker import start_worker

import celery_delayq
from celery_delayq import DelayedRetryTask
from celery_delayq.telemetry.wiring import flush_all, recorder_for


def run_once(broker: str, n: int, telemetry: str | None) -> float:
    """Seconds a solo worker takes to run ``n`` ladder-delivered tasks, first to last."""
    tag = uuid.uuid4().hex[:6]
    app = Celery(f"tele{tag}", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=f"tele.{tag}", delayq_prefix="delayq_bench", broker_heartbeat=0,
                    worker_hijack_root_logger=False, worker_prefetch_multiplier=200,
                    delayq_telemetry_dir=telemetry)
    done = threading.Event()
    stamps: list[float] = []

    @app.task(base=DelayedRetryTask, shared=False)
    def work(i: int) -> int:
        stamps.append(time.time())
        if len(stamps) == n:
            done.set()
        return i

    with celery_delayq.batch(app):
        for i in range(n):
            work.apply_async((i,), countdown=0.5)
    # let every message leave the ladder first, so the worker drains at full speed
    with app.connection_for_write() as conn:
        deadline = time.time() + 60
        while conn.default_channel.queue_declare(f"tele.{tag}", passive=True).message_count < n:
            if time.time() > deadline:
                raise SystemExit("the ladder did not deliver every message within 60 s")
            time.sleep(0.1)
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="ERROR", shutdown_timeout=10):
        if not done.wait(120):
            raise SystemExit(f"only {len(stamps)} of {n} tasks ran")
    elapsed = stamps[-1] - stamps[0]
    celery_delayq.uninstall(app)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(f"tele.{tag}")
    return elapsed


@click.command()
@click.option("--tasks", default=3000, show_default=True)
@click.option("--rounds", default=3, show_default=True)
@click.option("--broker", default="amqp://guest:guest@127.0.0.1:5672//", show_default=True)
@click.option("--out", default=None, help="Write the result as JSON here.")
def main(tasks: int, rounds: int, broker: str, out: str | None) -> None:
    root = tempfile.mkdtemp(prefix="delayq-telemetry-")
    off: list[float] = []
    on: list[float] = []
    for _ in range(rounds):
        off.append(tasks / run_once(broker, tasks, None))
        on.append(tasks / run_once(broker, tasks, root))
    flush_all()
    rec = recorder_for(root)
    result = {"tasks_per_round": tasks, "rounds": rounds, "off_tasks_per_s": off, "on_tasks_per_s": on,
              "median_off": statistics.median(off), "median_on": statistics.median(on),
              "overhead_pct": 100 * (1 - statistics.median(on) / statistics.median(off)),
              "events_written": rec.written, "events_dropped": rec.dropped}
    click.echo(json.dumps(result, indent=2))
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
