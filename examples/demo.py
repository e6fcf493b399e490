"""celery_delayq demo: a flaky task retrying with exponential backoff through the ladder.

Run against the local broker:  python examples/demo.py  [--keep | --clean]
(or ./dev demo, which also sets up the virtualenv). It starts a real Celery
worker in this process, sends a card charge that fails three times, and
prints, for every attempt, when it was due and when it ran. While the retry
waits, it shows which ladder levels hold the message: the worker holds nothing.

At the end it removes what it declared on the broker (the ladder's queues and
exchanges, their index streams and the demo's task queue) with the same code
as ``celery -A APP delayq topology delete``. ``--keep`` leaves them to look at
(``delayq status``, the management UI) and prints the one command that
removes them later: ``--clean``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import datetime

from celery import Celery
from celery.bin.base import CLIContext
from celery.contrib.testing.worker import start_worker

from celery_delayq import DelayedRetryTask, is_installed, ladder_for
from celery_delayq.cli import delayq
from celery_delayq.rabbitmq.probe import queue_depth

BROKER = os.environ.get("DELAYQ_DEMO_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
#: RabbitMQ's management API (the cleanup lists the broker through it); unset: http://<broker host>:15672.
MANAGEMENT = os.environ.get("DELAYQ_DEMO_MANAGEMENT_URL")
#: The demo's own names: everything it declares starts with one of them.
QUEUE, PREFIX = "delayq-demo", "delayq_demo"

app = Celery("shop", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    delayq_prefix=PREFIX,
    delayq_management_url=MANAGEMENT,
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
    assert is_installed(app)
    router = ladder_for(app)
    spec = router.config.spec
    conn = router.connection()
    conn.connect()
    last = None
    try:
        while not done.is_set():
            held = [(name, spec.queue_ttl_ms(k, d)) for k, d, name, _ in spec.level_queues()
                    if queue_depth(conn.connection, name)]
            if held != last and held:
                levels = ", ".join(f"{q} ({ttl / 1000:g} s)" for q, ttl in held)
                print(f"      ladder now holds the message in: {levels}")
            last = held
            time.sleep(0.05)
    finally:
        conn.release()


def remove_from_broker() -> None:
    """Delete the demo's ladder (``delayq topology delete``) and its task queue and exchange."""
    # The CLI command itself, in this process: the same checks and the same report an operator gets.
    delayq.main(["topology", "delete", "--yes", "--discard-messages"], prog_name="delayq",
                obj=CLIContext(app=app, no_color=True, workdir=None), standalone_mode=False)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.queue_delete(QUEUE)
        channel.exchange_delete(QUEUE)
    print(f"deleted the demo's task queue and exchange {QUEUE!r}")


def clean_command() -> str:
    """How to run this demo's --clean from where it was started."""
    via = os.environ.get("DELAYQ_DEMO_VIA")
    return f"{via} --clean" if via else f"{os.path.relpath(sys.executable)} {os.path.relpath(__file__)} --clean"


def run_demo() -> None:
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--keep", action="store_true",
                      help="leave the demo's queues on the broker to look at (--clean removes them)")
    what.add_argument("--clean", action="store_true", help="only remove what an earlier --keep left")
    args = parser.parse_args(argv)
    if args.clean:
        remove_from_broker()
        return
    try:
        run_demo()
    finally:
        if args.keep:
            print(f"\nThe demo's ladder ({PREFIX}.*) and task queue ({QUEUE}) are still on the broker, "
                  f"for you to look at. Remove them with:\n  {clean_command()}")
        else:
            print(f"\nRemoving what the demo declared on the broker (--keep leaves it):")
            remove_from_broker()


if __name__ == "__main__":
    main()
