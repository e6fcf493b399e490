"""What the worker's takeover costs: delayed tasks from a publisher without celery_delayq, moved into the ladder.

A vhost of its own (created and deleted here, with its ladder). One
``python -m celery -A proj worker -P solo`` with the ladder on; one publisher
process whose app module never imports celery_delayq sends ``N`` tasks with a
countdown. Reported: how fast the worker moved them (first to last "moved"
log line), and whether every one is in the pending index.

    .venv/bin/python benchmarks/takeover.py [-n 500] [--broker 127.0.0.1:5672]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from datetime import datetime
from pathlib import Path

PROJECT = '''
import os
from celery import Celery

app = Celery("proj", broker=os.environ["BROKER"])
app.conf.update(delayq_enabled=True, task_default_queue="tk", broker_heartbeat=0, worker_hijack_root_logger=False)


@app.task(name="proj.noop")
def noop():
    pass
'''

PUBLISH = '''
import sys, time
from proj import noop
assert "celery_delayq" not in sys.modules
start = time.time()
for _ in range({n}):
    noop.apply_async(countdown=600)
print(time.time() - start)
'''

MOVED = re.compile(r"^\[(?P<at>[0-9-]+ [0-9:,]+): \w+/MainProcess\] delayq: (moved task|task proj.noop)")


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=500)
    parser.add_argument("--broker", default=os.environ.get("DELAYQ_TEST_BROKER_HOST", "127.0.0.1:5672"))
    args = parser.parse_args()
    vhost = f"takeover-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", vhost)
    _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    workdir = Path(tempfile.mkdtemp(prefix="takeover-"))
    (workdir / "proj.py").write_text(PROJECT)
    env = dict(os.environ, BROKER=f"amqp://guest:guest@{args.broker}/{vhost}",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    log = workdir / "worker.log"
    proc = None
    try:
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "proj", "worker", "-P", "solo", "-l", "info",
                                     "--without-gossip", "--without-mingle"], cwd=workdir, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        while "ready." not in log.read_text():
            time.sleep(0.2)
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(PUBLISH.format(n=args.n))], cwd=workdir, env=env,
                              capture_output=True, text=True, check=True)
        published_s = float(done.stdout.strip())
        deadline = time.time() + 300
        while True:
            moved = [m for line in log.read_text().splitlines() if (m := MOVED.match(line))]
            if len(moved) >= args.n or time.time() > deadline:
                break
            time.sleep(0.5)
        stamps = [datetime.strptime(m.group("at"), "%Y-%m-%d %H:%M:%S,%f").timestamp() for m in moved]
        pending = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", "delayq", "pending", "--json"],
                                 cwd=workdir, env=env, capture_output=True, text=True, check=True)
        listed = len(json.loads(pending.stdout))
        span = max(stamps) - min(stamps) if len(stamps) > 1 else float("nan")
        print(json.dumps({"broker": args.broker, "n": args.n, "publisher_s": round(published_s, 2),
                          "moved": len(moved), "move_span_s": round(span, 2),
                          "moves_per_s": round((len(moved) - 1) / span, 1) if span == span and span > 0 else None,
                          "pending_listed": listed,
                          "warnings": log.read_text().count("outside the ladder")}))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        _ctl("delete_vhost", vhost)


if __name__ == "__main__":
    main()
