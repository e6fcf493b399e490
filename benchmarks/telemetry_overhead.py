"""Telemetry recording overhead, as a share of task throughput, in a real Celery worker.

    python benchmarks/telemetry_overhead.py --tasks 3000 --rounds 3
    python benchmarks/telemetry_overhead.py --micro   # CPU per event, no broker

Runs the same workload (delayed publishes through the ladder, then the tasks
in a solo worker) with ``delayq_telemetry_dir`` off and on, alternating
rounds in one process so machine noise hits both sides alike, and reports
tasks/s and the ratio (of the medians, and the median of each round's own
off/on ratio), plus the process CPU per task while the worker drains the
queue, which is less noisy on a shared machine. Every run records scheduled,
delivered and succeeded events; the timed window is the worker's (delivered +
succeeded), the publisher's scheduled events are written before it opens, as
a separate publisher process would.

``--micro`` times the worker-side handlers alone (``delivered`` through
``message_delivered.send``, ``succeeded`` through ``task_success.send``) with
telemetry not attached (off) and attached (on), and reports microseconds of
CPU per event: on the calling thread (the task's hot path) and for the whole
process including the writer thread's encoding and file writes (it shares the
GIL with the worker).  ``recording_cost_us`` (on - off) is what an event adds
to a task.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
import uuid

import click
from celery import Celery
from celery.contrib.testing.worker import start_worker

import celery_delayq
from celery_delayq import DelayedRetryTask
from celery_delayq.ladder import headers as H
from celery_delayq import signals as delayq_signals
from celery_delayq.telemetry import attach as telemetry_attach
from celery_delayq.telemetry import detach as telemetry_detach
from celery_delayq.telemetry import flush_all, recorder_for


def micro(n: int, repeat: int) -> dict[str, dict[str, float]]:
    """CPU microseconds per ``delivered`` / ``succeeded`` event, telemetry attached vs not."""
    from celery import signals as celery_signals
    from celery.contrib.testing.mocks import TaskMessage
    from celery.worker.request import Request

    def setup(telemetry: str | None):
        app = Celery(f"micro{uuid.uuid4().hex[:6]}", set_as_current=False)
        app.conf.update(delayq_telemetry_dir=telemetry)
        celery_delayq.install(app)
        if telemetry:
            telemetry_attach(app)  # idempotent when install() attached it already

        @app.task(base=DelayedRetryTask, shared=False)
        def work(i: int) -> int:
            return i

        work = app.tasks[work.name]  # the task itself, as a worker has it (not the lazy proxy)
        now = time.time()
        message = TaskMessage(work.name, args=(1,), retries=0, **{
            H.DUE: now, H.DELAY: 0.5, H.ENTRY: "e1", H.HOPS: 2, H.ATTEMPT: 0})
        message.delivery_info = {"exchange": "", "routing_key": "tele.bench", "redelivered": False}
        request = Request(message, app=app, task=work)
        work.push_request(request.request_dict, args=(1,), kwargs={}, called_directly=False)
        return app, work, request

    def deliver(task, request):
        delayq_signals.message_delivered.send(sender=task, request=request, due=1.0, delay=0.5, lateness=0.0)

    def succeed(task, request):
        celery_signals.task_success.send(sender=task, result=1, runtime=0.0)

    # The deprecated import-time wiring (while the glue still imports it) would add
    # its own per-event lookups to both sides; measure the subscriber alone.
    legacy = sys.modules.get("celery_delayq.telemetry.wiring")
    if legacy is not None:
        legacy.disconnect()
    results: dict[str, dict[str, float]] = {}
    for name, fn in (("delivered", deliver), ("succeeded", succeed)):
        per_mode: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        for _ in range(repeat):
            for mode in ("off", "on"):
                root = tempfile.mkdtemp(prefix="delayq-micro-") if mode == "on" else None
                app, task, request = setup(root)
                fn(task, request)  # warm caches (recorder, writer thread)
                if root:
                    recorder_for(root).flush()
                p0, t0 = time.process_time(), time.thread_time()
                for _ in range(n):
                    fn(task, request)
                t1 = time.thread_time()
                if root:
                    recorder_for(root).close()  # the writer's share: encode + write everything
                p1 = time.process_time()
                per_mode[mode].append((1e6 * (t1 - t0) / n, 1e6 * (p1 - p0) / n))
                telemetry_detach(app)
                celery_delayq.uninstall(app)
        best = {mode: (min(x[0] for x in v), min(x[1] for x in v)) for mode, v in per_mode.items()}
        results[name] = {
            # CPU us per signal sent, best of `repeat` runs
            "telemetry_off_us": round(best["off"][1], 2),  # not attached: no receiver at all
            "telemetry_on_calling_thread_us": round(best["on"][0], 2),
            "telemetry_on_process_us": round(best["on"][1], 2),
            # what recording adds per event (on - off, all threads): the throughput overhead
            "recording_cost_us": round(best["on"][1] - best["off"][1], 2),
        }
    if legacy is not None:
        legacy.connect()
    return results


def run_once(broker: str, n: int, telemetry: str | None) -> tuple[float, float]:
    """Seconds a solo worker takes to run ``n`` ladder-delivered tasks, first to last,
    and the process CPU seconds spent meanwhile (worker, consumer and writer threads)."""
    tag = uuid.uuid4().hex[:6]
    app = Celery(f"tele{tag}", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=f"tele.{tag}", delayq_prefix="delayq_bench", broker_heartbeat=0,
                    worker_hijack_root_logger=False, worker_prefetch_multiplier=200,
                    delayq_telemetry_dir=telemetry)
    done = threading.Event()
    stamps: list[float] = []
    cpu: list[float] = []

    @app.task(base=DelayedRetryTask, shared=False)
    def work(i: int) -> int:
        stamps.append(time.time())
        if len(stamps) == 1 or len(stamps) == n:
            cpu.append(time.process_time())
        if len(stamps) == n:
            done.set()
        return i

    if telemetry:
        telemetry_attach(app)  # idempotent when install() attaches it
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
    # The publisher's ``scheduled`` events are written now, outside the timed window,
    # as they would be in a separate publisher process.
    flush_all()
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="ERROR", shutdown_timeout=10):
        if not done.wait(120):
            raise SystemExit(f"only {len(stamps)} of {n} tasks ran")
    elapsed = stamps[-1] - stamps[0]
    topology = celery_delayq.ladder_for(app).publisher.topology
    exit_queue = topology.destination("", f"tele.{tag}").exit_queue if topology is not None else None
    telemetry_detach(app)
    celery_delayq.uninstall(app)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(f"tele.{tag}")
        if exit_queue:  # every round has its own queue: do not leave an exit queue per round behind
            conn.default_channel.queue_delete(exit_queue)
    return elapsed, cpu[-1] - cpu[0]


@click.command()
@click.option("--tasks", default=3000, show_default=True)
@click.option("--rounds", default=3, show_default=True)
@click.option("--broker", default="amqp://guest:guest@127.0.0.1:5672//", show_default=True)
@click.option("--out", default=None, help="Write the result as JSON here.")
@click.option("--micro", "micro_n", is_flag=False, flag_value=50_000, default=None, type=int,
              help="Only time the handlers: CPU us per event over this many events (default 50000).")
def main(tasks: int, rounds: int, broker: str, out: str | None, micro_n: int | None) -> None:
    if micro_n:
        result = {"micro": micro(micro_n, repeat=max(rounds, 5)), "events_per_run": micro_n}
        click.echo(json.dumps(result, indent=2))
        if out:
            with open(out, "w") as fh:
                json.dump(result, fh, indent=2)
        return
    root = tempfile.mkdtemp(prefix="delayq-telemetry-")
    off: list[float] = []
    on: list[float] = []
    cpu_off: list[float] = []
    cpu_on: list[float] = []
    for i in range(rounds):
        # Alternate which side goes first, so a drift in machine load hits both alike.
        for telemetry in ((None, root) if i % 2 == 0 else (root, None)):
            elapsed, cpu = run_once(broker, tasks, telemetry)
            (on if telemetry else off).append(tasks / elapsed)
            (cpu_on if telemetry else cpu_off).append(1e6 * cpu / tasks)
    flush_all()
    rec = recorder_for(root)
    ratios = [b / a for a, b in zip(off, on)]
    result = {"tasks_per_round": tasks, "rounds": rounds, "off_tasks_per_s": off, "on_tasks_per_s": on,
              "median_off": statistics.median(off), "median_on": statistics.median(on),
              "overhead_pct": 100 * (1 - statistics.median(on) / statistics.median(off)),
              # the same, from each round's own off/on pair (less sensitive to slow drifts)
              "paired_overhead_pct": 100 * (1 - statistics.median(ratios)),
              # process CPU per task while the worker drained the queue (less noisy than wall time)
              "cpu_us_per_task_off_rounds": cpu_off, "cpu_us_per_task_on_rounds": cpu_on,
              "cpu_us_per_task_off": statistics.median(cpu_off),
              "cpu_us_per_task_on": statistics.median(cpu_on),
              "cpu_overhead_pct": 100 * (statistics.median(cpu_on) / statistics.median(cpu_off) - 1),
              "events_written": rec.written, "events_dropped": rec.dropped}
    click.echo(json.dumps(result, indent=2))
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
