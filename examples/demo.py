"""celery_delayq demo: a flaky task retrying with exponential backoff through the ladder.

Run against the local broker:  python examples/demo.py
(or ./dev demo, which also sets up the virtualenv). It starts a real Celery
worker in this process, sends a card charge that fails three times, and
prints, for every attempt, when it was due and when it ran. While the retry
waits, it shows which ladder levels hold the message: the worker holds nothing.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime

from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_delayq import DelayedRetryTask, router_for
from celery_delayq.occupancy import ladder_occupancy

BROKER = os.environ.get("DELAYQ_DEMO_BROKER", "amqp://guest:guest@127.0.0.1:5672//")

app = Celery("shop", broker=BROKER)
app.conf.update(
    task_default_queue="delayq-demo",
    delayq_prefix="delayq_demo",
    broker_heartbeat=0,
    worker_hijack_root_logger=False,
)

done = threading.Event()


def clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


@app.task(base=DelayedRetryTask, bind=True, autoretry_for=(ConnectionError,),
          retry_backoff=1, retry_jitter=False, max_retries=5)
def charge(self, order_id: int) -> str:
    """Charge an order; the card processor is down for the first three attempts."""
    ran = time.time()
    attempt = self.request.retries
    if self.request.eta is not None:
        due = datetime.fromisoformat(str(self.request.eta)).timestamp()
        print(f"  attempt {attempt}: due {clock(due)}  ran {clock(ran)}  (late by {(ran - due) * 1000:.1f} ms)")
    else:
        print(f"  attempt {attempt}: ran {clock(ran)} (first try, no delay)")
    if attempt < 3:
        backoff = 2 ** attempt
        print(f"    card processor unavailable -> retry in {backoff} s, waiting in RabbitMQ")
        raise ConnectionError("card processor unavailable")
    print(f"    order {order_id} charged")
    done.set()
    return "charged"


def watch_ladder() -> None:
    """Print the ladder levels that hold a message whenever that changes."""
    router = router_for(app)
    assert router is not None
    spec = router.config.spec
    conn = router.connection()
    conn.connect()
    last = None
    try:
        while not done.is_set():
            held = [(r.queue, r.ttl_ms) for r in ladder_occupancy(conn.connection, spec, nonempty=True)]
            if held != last and held:
                levels = ", ".join(f"{q} ({ttl / 1000:g} s)" for q, ttl in held)
                print(f"      ladder now holds the message in: {levels}")
            last = held
            time.sleep(0.05)
    finally:
        conn.release()


def main() -> None:
    print(f"celery_delayq demo against {BROKER.split('@')[-1]}")
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=10):
        watcher = threading.Thread(target=watch_ladder, daemon=True)
        watcher.start()
        print("\n1) charge.apply_async((42,), countdown=0.5) -- sub-second countdowns work:")
        charge.apply_async((42,), countdown=0.5)
        if not done.wait(30):
            raise SystemExit("the demo task did not finish in 30 s: is RabbitMQ running?")
        watcher.join(2)
        time.sleep(0.2)
    print("\nEvery wait happened in RabbitMQ TTL queues; the worker held no message while it waited.")


if __name__ == "__main__":
    main()
