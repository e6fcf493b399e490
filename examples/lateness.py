"""Measure delivery lateness of a few hundred delayed tasks, with telemetry on.

    python examples/lateness.py --tasks 500 --telemetry /tmp/delayq-events
    python -m celery_delayq.analytics --events /tmp/delayq-events --out /tmp/delayq-report

A real worker (in this process) runs tasks sent with random countdowns from
50 ms to 8 s through the ladder; each task records when it ran against when
it was due. Prints p50/p99/max lateness and how many ran early (must be 0).
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time

import click
from celery import Celery
from celery.contrib.testing.worker import start_worker

import celery_delayq
from celery_delayq import DelayedRetryTask
from celery_delayq.telemetry import flush_all


@click.command()
@click.option("--tasks", default=500, show_default=True, help="Delayed tasks to send.")
@click.option("--max-delay", default=8.0, show_default=True, help="Countdowns are uniform in [0.05, this] s.")
@click.option("--telemetry", default=None, help="Write telemetry events under this directory.")
@click.option("--broker", default=os.environ.get("DELAYQ_DEMO_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
@click.option("--keep-ladder", is_flag=True, help="Keep the ladder on the broker afterwards (default: delete it).")
def main(tasks: int, max_delay: float, telemetry: str | None, broker: str, keep_ladder: bool) -> None:
    app = Celery("lateness", broker=broker)
    app.conf.update(task_default_queue="delayq-lateness", delayq_prefix="delayq_demo", broker_heartbeat=0,
                    worker_hijack_root_logger=False, worker_prefetch_multiplier=100,
                    delayq_telemetry_dir=telemetry)
    runs: list[float] = []
    lock = threading.Lock()
    finished = threading.Event()

    @app.task(base=DelayedRetryTask)
    def probe(due: float) -> None:
        with lock:
            runs.append(time.time() - due)
            if len(runs) == tasks:
                finished.set()

    rng = random.Random(7)
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=10):
        start = time.time()
        with celery_delayq.batch(app):
            for _ in range(tasks):
                countdown = rng.uniform(0.05, max_delay)
                probe.apply_async((time.time() + countdown,), countdown=countdown)
        sent = time.time() - start
        if not finished.wait(max_delay + 60):
            raise SystemExit(f"only {len(runs)} of {tasks} tasks ran")
    flush_all()
    ms = sorted(r * 1000 for r in runs)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    click.echo(f"{tasks} delayed tasks sent in {sent:.2f} s; countdowns 0.05-{max_delay:g} s")
    click.echo(f"lateness: p50 {p(0.5):.1f} ms  p99 {p(0.99):.1f} ms  max {ms[-1]:.1f} ms  "
               f"mean {statistics.mean(ms):.1f} ms  early: {sum(1 for v in ms if v < 0)}")
    _remove_ladder(app, keep_ladder)


def _remove_ladder(app: Celery, keep: bool) -> None:
    """Leave no ladder behind: on RabbitMQ 3.x every ladder reserves ~129 file handles (docs/footprint.md)."""
    how = f"remove it with `celery -A <app> delayq topology delete` and delayq_prefix={app.conf.delayq_prefix!r}"
    if keep:
        click.echo(f"kept the ladder {app.conf.delayq_prefix!r} on the broker; {how}")
        return
    publisher = celery_delayq.ladder_for(app).publisher
    topology = publisher.declare()
    try:
        raw = publisher.raw_connection()
        deleted = topology.delete(raw)  # only once empty: a demo may share the prefix
        channel = raw.channel()
        channel.queue_delete(app.conf.task_default_queue, if_empty=True)  # the example's own destination
        channel.exchange_delete(app.conf.task_default_queue)  # and Celery's exchange of the same name
        channel.close()
    except celery_delayq.TopologyError as exc:
        click.echo(f"kept the ladder: {exc} Once it drains, {how}.")
        return
    finally:
        publisher.close()
    click.echo(f"deleted the ladder {app.conf.delayq_prefix!r} ({len(deleted)} exchanges and queues) and the "
               f"queue and exchange {app.conf.task_default_queue!r}; --keep-ladder keeps them")


if __name__ == "__main__":
    main()
