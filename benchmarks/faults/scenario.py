"""One fault, measured: delayed tasks published, a node killed or stopped, every arrival timed.

A separate process publishes ``n`` delayed tasks (confirmed, inside
``celery_delayq.batch``) to a destination queue (Celery's default, classic, on a
node that is not hit); each task carries its
due time. A reader consumes the destination queue through a node that is not
the victim (or through the victim once it is back, on a single node), across
the outage. The victim is hit ``hit_after`` seconds after publishing, and comes
back ``down_for`` seconds later. With ``recover`` the operator's
``delayq topology recover`` runs every 10 s after the restart, as a worker's
watcher does by itself (:mod:`celery_delayq.rabbitmq.recovery`).

The result counts published, confirmed, delivered, lost, duplicates and early
deliveries, and the lateness (arrival - due) percentiles.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import amqp

from .nodes import Cluster

__all__ = ["FaultResult", "run_fault", "Arrivals"]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class FaultResult:
    """What one fault did to ``published`` delayed tasks."""

    broker: str
    nodes: int
    fault: str
    recover: bool
    published: int
    confirmed: int
    delivered: int
    lost: int
    duplicates: int
    early: int
    outage_s: float
    late_p50_s: float
    late_p99_s: float
    late_max_s: float
    recover_said: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return asdict(self)


class Arrivals(threading.Thread):
    """Reads a queue through outages (reconnecting), recording (due, arrived) per task id."""

    def __init__(self, ports: list[int], queue: str) -> None:
        super().__init__(daemon=True)
        self.ports, self.queue = ports, queue
        self.seen: dict[str, tuple[float, float]] = {}
        self.dupes = 0
        self.stop = threading.Event()

    def run(self) -> None:
        attempt = 0
        while not self.stop.is_set():
            port = self.ports[attempt % len(self.ports)]
            attempt += 1
            try:
                conn = amqp.Connection(f"127.0.0.1:{port}", connect_timeout=2)
                conn.connect()
                try:
                    self._drain(conn.channel())
                finally:
                    conn.collect()
            except Exception:  # noqa: BLE001 - the node is down or the queue is failing over: again
                time.sleep(0.3)

    def _drain(self, ch: Any) -> None:
        while not self.stop.is_set():
            msg = ch.basic_get(self.queue, no_ack=True)
            if msg is None:
                time.sleep(0.02)
                continue
            self.record(msg, time.time())

    def record(self, msg: Any, now: float) -> None:
        """One arrival of a task whose first argument is its due time; a task seen before is a duplicate."""
        task_id = msg.headers["id"]
        if task_id in self.seen:
            self.dupes += 1
        else:
            self.seen[task_id] = (float(json.loads(msg.body)[0][0]), now)


def _app_file(workdir: Path, url: str, mgmt_url: str, prefix: str, shards: int = 1, extra: str = "") -> None:
    (workdir / "faultapp.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        import celery_delayq  # noqa: F401 - the ladder turns on where the package is imported
        app = Celery("faultapp", broker={url!r})
        app.conf.update(delayq_enabled=True, delayq_prefix={prefix!r}, delayq_management_url={mgmt_url!r},
                        task_default_queue={prefix + "-dest"!r}, delayq_shards={shards!r}{extra})

        @app.task(name="faultapp.noop")
        def noop(due):
            return due
    """))


_PUBLISH = """
import random, sys, time
from kombu import Queue
import celery_delayq, faultapp
with faultapp.app.connection_for_write() as c:
    Queue(faultapp.app.conf.task_default_queue, channel=c.default_channel, durable=True).declare()
rng = random.Random(7)
n, lo, hi = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
sent = 0
try:
    with celery_delayq.batch(faultapp.app):
        for i in range(n):
            delay = rng.uniform(lo, hi)
            faultapp.noop.apply_async((time.time() + delay,), countdown=delay)
            sent += 1
    print(sent, sent)
except celery_delayq.PublishError as exc:
    print(sent, sent - len(exc.failed))
"""


def run_fault(cluster: Cluster, *, fault: str = "kill9", victim: int = 0, n: int = 1000,
              delays: tuple[float, float] = (4.0, 25.0), hit_after: float = 3.0, down_for: float = 5.0,
              recover: bool = True, workdir: Path, settle_s: float = 120.0) -> FaultResult:
    """Publish, hit node ``victim`` with ``fault`` (``kill9``, ``stop_app`` or ``partition``), bring it back, time every arrival."""
    prefix = f"fault{uuid.uuid4().hex[:6]}"
    entry = cluster.nodes[0] if victim != 0 or len(cluster.nodes) == 1 else cluster.nodes[1]
    _app_file(workdir, entry.url, entry.mgmt_url, prefix)
    env = dict(os.environ, PYTHONPATH=f"{workdir}:{REPO}")
    done = subprocess.run([sys.executable, "-c", _PUBLISH, str(n), str(delays[0]), str(delays[1])], env=env,
                          capture_output=True, text=True, timeout=300, cwd=workdir)
    if done.returncode != 0:
        raise RuntimeError(f"the publisher failed: {done.stderr[-3000:]}")
    published, confirmed = (int(x) for x in done.stdout.split())
    readers = [node.amqp_port for i, node in enumerate(cluster.nodes) if i != victim] or [cluster.nodes[0].amqp_port]
    arrivals = Arrivals(readers, f"{prefix}-dest")
    arrivals.start()
    time.sleep(hit_after)
    target = cluster.nodes[victim]
    down_at = time.time()
    if fault == "kill9":
        target.kill9()
        time.sleep(down_for)
        target.boot()
    elif fault == "stop_app":
        target.stop_app()
        time.sleep(down_for)
        target.start_app()
    elif fault == "partition":  # the victim alone on one side; it pauses under pause_minority
        others = [n for n in cluster.nodes if n is not target]
        target.cut_off(others)
        time.sleep(down_for)
        target.reconnect(others)
        _wait_rejoined(cluster)
    else:
        raise ValueError(f"unknown fault {fault!r}")
    outage = time.time() - down_at
    said: list[str] = []
    deadline = time.time() + settle_s
    next_look = time.time()
    while len(arrivals.seen) < confirmed and time.time() < deadline:
        if recover and time.time() >= next_look:  # what a worker's HeldWatcher does, every 10 s here
            out = subprocess.run([sys.executable, "-m", "celery", "-A", "faultapp", "delayq", "topology", "recover"],
                                 env=env, capture_output=True, text=True, timeout=60, cwd=workdir)
            text = (out.stdout or out.stderr).strip()
            if "nothing to do" not in text:
                said.append(text)
            next_look = time.time() + 10.0
        time.sleep(0.5)
    time.sleep(1.0)  # late duplicates
    arrivals.stop.set()
    late = sorted(arrived - due for due, arrived in arrivals.seen.values())
    q = statistics.quantiles(late, n=100) if len(late) > 1 else [late[0]] * 99 if late else [float("nan")] * 99
    return FaultResult(
        broker=_version(entry), nodes=len(cluster.nodes), fault=fault, recover=recover, published=published,
        confirmed=confirmed, delivered=len(arrivals.seen), lost=confirmed - len(arrivals.seen),
        duplicates=arrivals.dupes, early=sum(1 for x in late if x < 0), outage_s=round(outage, 1),
        late_p50_s=round(q[49], 3), late_p99_s=round(q[98], 3), late_max_s=round(late[-1], 3) if late else float("nan"),
        recover_said=said)


def _wait_rejoined(cluster: Cluster, timeout: float = 120.0) -> None:
    """Until every node is running and sees all the others (a paused minority restarts by itself)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(cluster.running_as_seen_by(n)) == len(cluster.nodes) for n in cluster.nodes):
            return
        time.sleep(1.0)
    raise RuntimeError(f"the cluster did not heal within {timeout:.0f} s: running {cluster.running()}")


def _version(node: Any) -> str:
    conn = amqp.Connection(f"127.0.0.1:{node.amqp_port}", connect_timeout=5)
    conn.connect()
    try:
        raw = conn.server_properties.get("version", b"?")
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    finally:
        conn.close()
