"""A real run for the report: a worker with succeeding, retried, failing, parked and revoked tasks.

    python benchmarks/analytics_real_run.py --minutes 20 --out /tmp/delayq-real

Creates a vhost of its own on the local RabbitMQ (deleted at the end), turns
telemetry on (``delayq_telemetry_dir``), starts a real prefork worker, and
for ``--minutes`` publishes delayed work every second:

* ``orders.confirm``: succeeds, countdowns of 0.2–5 s;
* ``crm.sync_contact``: flaky (retries with back-off); three-quarters into the
  run, for three minutes, its dependency is "down" and most runs retry: a retry storm;
* ``webhooks.deliver``: gives up after 2 retries and is parked;
* ``imports.parse_row``: bad rows are parked at once (``delayq_park_on``);
* ``reports.render``: a plain task that sometimes fails (``failed``);
* a few ``orders.confirm`` are revoked before they are due (``cancelled``).

At the end the parked messages are replayed once, and ``celery -A realrun_app
delayq report`` runs over the events (``--report``) while the vhost still
exists, so its first section shows what the broker holds then.  Telemetry lands in ``<out>/events``, the
report in ``<out>/report``.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import click

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

_APP_MODULE = '''
import os, random, time
from celery import Celery
from celery_delayq import DelayedRetryTask

app = Celery("realrun", broker=os.environ["REALRUN_BROKER"], set_as_current=True)
app.conf.update(
    task_default_queue="realrun.work", delayq_enabled=True, delayq_prefix="realrun",
    delayq_telemetry_dir=os.environ["REALRUN_EVENTS"], delayq_parking_queue_type="classic",
    worker_prefetch_multiplier=20, broker_heartbeat=0,
    task_routes={"reports.*": {"queue": "realrun.reports"}, "imports.*": {"queue": "realrun.imports"}},
)
OUTAGE = (float(os.environ["REALRUN_OUTAGE_START"]), float(os.environ["REALRUN_OUTAGE_END"]))


class Down(ConnectionError):
    pass


class BadRow(ValueError):
    pass


@app.task(base=DelayedRetryTask, bind=True)
def confirm(self, n):
    time.sleep(0.005)
    return n


@app.task(base=DelayedRetryTask, bind=True, name="crm.sync_contact", max_retries=6,
          default_retry_delay=1.0, retry_backoff=True, retry_backoff_max=20, retry_jitter=False)
def sync_contact(self, n):
    down = OUTAGE[0] <= time.time() < OUTAGE[1]
    if random.random() < (0.9 if down else 0.1):
        raise self.retry(exc=Down("crm api unreachable"))
    return n


@app.task(base=DelayedRetryTask, bind=True, name="webhooks.deliver", max_retries=2,
          default_retry_delay=0.5)
def deliver(self, n):
    if n % 7 == 0:
        raise self.retry(exc=TimeoutError("endpoint timed out"))
    return n


@app.task(base=DelayedRetryTask, bind=True, name="imports.parse_row", delayq_park_on=(BadRow,))
def parse_row(self, n):
    if n % 11 == 0:
        raise BadRow(f"row {n}: bad date")
    return n


@app.task(name="reports.render")
def render(n):
    if n % 13 == 0:
        raise KeyError(f"template {n} missing")
    return n
'''


RABBITMQCTL = ["rabbitmqctl"]


def _ctl(*args: str) -> None:
    subprocess.run([*RABBITMQCTL, "-q", *args], check=True, capture_output=True, timeout=120)


@click.command()
@click.option("--minutes", default=20.0, show_default=True)
@click.option("--rate", default=6, show_default=True, help="Tasks published per second.")
@click.option("--out", "out_dir", default="/tmp/delayq-real", show_default=True, type=click.Path(path_type=Path))
@click.option("--report/--no-report", default=True, show_default=True)
@click.option("--broker-host", default="127.0.0.1:5672", show_default=True)
@click.option("--rabbitmqctl", "ctl", default="rabbitmqctl", show_default=True,
              help="rabbitmqctl of that broker (e.g. /tmp/rmq4shim/rabbitmqctl for the 4.3 node).")
@click.option("--outage-at", default=0.75, show_default=True,
              help="When crm.sync_contact's dependency goes down, as a fraction of --minutes "
              "(after the report's 15-minute warm-up for storms).")
def main(minutes: float, rate: int, out_dir: Path, report: bool, broker_host: str, ctl: str,
         outage_at: float) -> None:
    RABBITMQCTL[:] = [ctl]
    shutil.rmtree(out_dir, ignore_errors=True)
    events = out_dir / "events"
    events.mkdir(parents=True)
    vhost = f"realrun-{uuid.uuid4().hex[:6]}"
    _ctl("add_vhost", vhost)
    _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    module_dir = out_dir / "app"
    module_dir.mkdir()
    (module_dir / "realrun_app.py").write_text(_APP_MODULE)
    start = time.time()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(module_dir), str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
        "REALRUN_BROKER": f"amqp://guest:guest@{broker_host}/{vhost}",
        "REALRUN_EVENTS": str(events),
        "REALRUN_OUTAGE_START": str(start + outage_at * minutes * 60),
        "REALRUN_OUTAGE_END": str(start + outage_at * minutes * 60 + 180),
    }
    os.environ.update({k: v for k, v in env.items() if k.startswith("REALRUN_")})
    sys.path.insert(0, str(module_dir))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "realrun_app", "worker", "-c", "2", "-l", "WARNING",
         "-Q", "realrun.work,realrun.reports,realrun.imports"],
        env=env, cwd=module_dir,
    )
    try:
        import realrun_app as m
        from celery_delayq.parking import ParkingQueue
        from celery_delayq.telemetry import flush_all

        rng = random.Random(1)
        n = 0
        deadline = start + minutes * 60
        while time.time() < deadline:
            tick = time.time()
            for _ in range(rate):
                n += 1
                kind = rng.random()
                if kind < 0.35:
                    res = m.confirm.apply_async((n,), countdown=rng.uniform(0.2, 5))
                    if rng.random() < 0.03:
                        res.revoke()
                elif kind < 0.6:
                    m.sync_contact.apply_async((n,), countdown=rng.uniform(0.5, 3))
                elif kind < 0.75:
                    m.deliver.apply_async((n,), countdown=rng.uniform(0.1, 2))
                elif kind < 0.9:
                    m.parse_row.apply_async((n,), countdown=rng.uniform(0.1, 1))
                else:
                    m.render.apply_async((n,), countdown=rng.uniform(0.1, 1))
            time.sleep(max(0.0, 1.0 - (time.time() - tick)))
        time.sleep(30)  # let the last retries finish
        with ParkingQueue.for_app(m.app) as parked:
            print(f"replaying {parked.count()} parked messages", flush=True)
            print(parked.replay(), flush=True)
        time.sleep(10)
        flush_all()
        print(f"published {n} tasks in {minutes} min; events in {events}", flush=True)
        if report:
            # As an operator runs it, while the vhost still exists: the report opens with what
            # the broker holds now (the parked messages a replay parked again, the ladder's queues).
            subprocess.run([sys.executable, "-m", "celery", "-A", "realrun_app", "delayq", "report",
                            "--out", str(out_dir / "report"), "--master", "local[2]"],
                           check=True, env=env, cwd=module_dir)
    finally:
        worker.terminate()
        worker.wait(60)
        _ctl("delete_vhost", vhost)


if __name__ == "__main__":
    main()
