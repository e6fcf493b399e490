"""One fault at load: many tasks flowing through the ladder's dead-letter workers when a node dies.

What issue #27 measured and the light suite (:mod:`.scenario`) missed: with
1,000 tasks and the fault after publishing, little is in flight in the
quorum queues' dead-letter workers at the kill. Here, as a user runs a
cluster:

- an app whose ``broker_url`` lists the three nodes (a failover list), the
  management URL naming one node (``mgmt_node``), leaders spread;
- a delayq worker running (its held-message watcher on; it consumes an idle
  queue, so the arrivals are the ladder's, timed by a reader);
- task queues of type ``destination``: ``quorum`` (Celery's
  ``task_default_queue_type``, what a cluster needs) or ``classic`` (Celery's
  default: a classic queue lives on one node, so while that node is down its
  tasks cannot arrive, and a worker whose queue it is stops with
  "home node ... is down");
- ``n`` tasks with countdowns uniform in ``delays``, published at an even
  rate over ``publish_s`` seconds (confirmed, in ``batch()`` chunks of 50; what
  was not confirmed is sent again as new tasks, as an app retries; lost =
  confirmed task ids that never arrived);
- at ``hit_at`` seconds after publishing starts, kill -9 of the node that
  leads most of the ladder's queues, back ``down_for`` seconds later;
- every arrival timed by a reader on the destination queue through the
  other nodes: lost, duplicates, early, lateness percentiles.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..common import stop_process
from .nodes import Cluster
from .scenario import Arrivals, _version


class AckedArrivals(Arrivals):
    """:class:`Arrivals` that acks each message after recording it.

    A ``no_ack`` get whose reply dies with a failing-over connection would be
    a loss of the reader's own; acked, it comes again and counts as a duplicate.
    """

    def _drain(self, ch: Any) -> None:
        while not self.stop.is_set():
            msg = ch.basic_get(self.queue, no_ack=False)
            if msg is None:
                time.sleep(0.02)
                continue
            self.record(msg, time.time())
            ch.basic_ack(msg.delivery_tag)

__all__ = ["LoadResult", "run_load_fault"]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class LoadResult:
    """What one kill -9 at load did."""

    broker: str
    nodes: int
    tasks: int
    publish_s: float
    hit_at_s: float
    published: int
    confirmed: int
    delivered: int
    lost: int
    duplicates: int
    early: int
    outage_s: float
    late_p50_s: float
    late_p90_s: float
    late_p99_s: float
    late_max_s: float
    late_over_30s: int
    late_over_120s: int
    victim_leaders: str
    held_peak: int
    missing: list[str]
    destination: str
    worker_survived: bool
    worker_said: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _app_file(workdir: Path, urls: list[str], mgmt_url: str, prefix: str, destination: str) -> None:
    (workdir / "loadapp.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        import celery_delayq  # noqa: F401 - the ladder turns on where the package is imported
        app = Celery("loadapp", broker={";".join(urls)!r})
        app.conf.update(delayq_enabled=True, delayq_prefix={prefix!r}, delayq_management_url={mgmt_url!r},
                        delayq_leader_placement="spread", task_default_queue={prefix + "-dest"!r},
                        broker_connection_retry_on_startup=True, task_default_queue_type={destination!r},
                        task_create_missing_queue_type={destination!r},
                        worker_detect_quorum_queues=True)

        @app.task(name="loadapp.noop")
        def noop(due):
            return due
    """))


_PUBLISH = """
import random, sys, time
from kombu import Queue
import celery_delayq, loadapp
with loadapp.app.connection_for_write() as c:
    Queue(loadapp.app.conf.task_default_queue, channel=c.default_channel, durable=True,
          queue_arguments={"x-queue-type": loadapp.app.conf.task_default_queue_type}).declare()
rng = random.Random(7)
n, lo, hi, over = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
chunk = 50
out = open("confirmed.txt", "w")
start = time.time()
sent = confirmed = 0
for first in range(0, n, chunk):
    wait = start + over * first / n - time.time()
    if wait > 0:
        time.sleep(wait)
    remaining = min(chunk, n - first)
    for attempt in range(5):  # what failed with the node is sent again, as new tasks, as an app would retry
        ids = []
        try:
            with celery_delayq.batch(loadapp.app):
                for i in range(remaining):
                    delay = rng.uniform(lo, hi)
                    ids.append(loadapp.noop.apply_async((time.time() + delay,), countdown=delay).id)
            failed = set()
        except celery_delayq.PublishError as exc:
            failed = set(exc.failed)
        except Exception as exc:  # noqa: BLE001 - the connection died with the node: reconnect, send again
            print("retry", repr(exc)[:200], file=sys.stderr, flush=True)
            failed = set(ids) | {None}
            time.sleep(1)
        sent += len(ids)
        good = [i for i in ids if i not in failed]
        confirmed += len(good)
        out.write("".join(i + "\\n" for i in good))
        remaining -= len(good)
        if not remaining:
            break
out.close()
print(sent, confirmed, flush=True)
"""


def _api_get(url: str, path: str) -> Any:
    req = urllib.request.Request(url + path)
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - a private node
        return json.load(resp)


def _ladder_rows(cluster: Cluster, prefix: str, skip: int | None = None) -> list[dict[str, Any]]:
    for i, node in enumerate(cluster.nodes):
        if i == skip:
            continue
        try:
            rows = _api_get(node.mgmt_url, "/api/queues/%2F?columns=name,type,leader,node,messages,messages_ready,"
                                           "messages_unacknowledged")
            return [r for r in rows if str(r.get("name", "")).startswith(f"{prefix}.")]
        except OSError:
            continue
    return []


def _most_leaders(cluster: Cluster, prefix: str) -> tuple[int, dict[str, int]]:
    counts: dict[str, int] = {}
    for row in _ladder_rows(cluster, prefix):
        if row.get("type") == "quorum":
            leader = str(row.get("leader") or row.get("node"))
            counts[leader] = counts.get(leader, 0) + 1
    names = [n.nodename for n in cluster.nodes]
    best = max(range(len(names)), key=lambda i: (counts.get(names[i], 0), -i))
    return best, counts


def run_load_fault(cluster: Cluster, *, n: int = 5000, delays: tuple[float, float] = (5.0, 60.0),
                   publish_s: float = 15.0, hit_at: float = 15.0, down_for: float = 20.0, mgmt_node: int = 1,
                   destination: str = "quorum", workdir: Path, settle_s: float = 480.0, say: Any = print) -> LoadResult:
    """Publish ``n`` tasks over ``publish_s``, kill -9 the node leading most ladder queues at ``hit_at``, time arrivals."""
    prefix = f"load{uuid.uuid4().hex[:6]}"
    _app_file(workdir, [node.url for node in cluster.nodes], cluster.nodes[mgmt_node].mgmt_url, prefix, destination)
    env = dict(os.environ, PYTHONPATH=f"{workdir}:{REPO}")
    worker_log = workdir / "worker.log"
    with open(worker_log, "wb") as sink:
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "loadapp", "worker", "-Q", f"{prefix}-idle",
                                   "--pool", "solo", "-l", "INFO", "--without-gossip", "--without-mingle",
                                   "--without-heartbeat"], env=env, cwd=workdir, stdout=sink,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while b"ready" not in worker_log.read_bytes() and time.time() < deadline:
            time.sleep(0.5)
        start = time.time()
        publisher = subprocess.Popen([sys.executable, "-c", _PUBLISH, str(n), str(delays[0]), str(delays[1]),
                                      str(publish_s)], env=env, cwd=workdir, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        arrivals = AckedArrivals([node.amqp_port for node in cluster.nodes], f"{prefix}-dest")
        time.sleep(max(hit_at - 3.0, 1.0))
        victim, counts = _most_leaders(cluster, prefix)
        arrivals.ports = [node.amqp_port for i, node in enumerate(cluster.nodes) if i != victim]
        arrivals.start()
        time.sleep(max(start + hit_at - time.time(), 0))
        target = cluster.nodes[victim]
        say(f"    t={time.time() - start:.1f}s kill -9 {target.nodename} (leaders {counts})")
        down_at = time.time()
        target.kill9()
        time.sleep(max(down_at + down_for - time.time(), 0))
        target.boot()
        outage = time.time() - down_at
        say(f"    t={time.time() - start:.1f}s {target.nodename} back after {outage:.1f}s")
        out, err = publisher.communicate(timeout=600)
        if publisher.returncode != 0:
            raise RuntimeError(f"the publisher failed: {err[-3000:]}")
        published, confirmed = (int(x) for x in out.split())
        confirmed_ids = set((workdir / "confirmed.txt").read_text().split())
        held_peak = 0
        deadline = time.time() + settle_s
        next_report = time.time()
        while not confirmed_ids <= set(arrivals.seen) and time.time() < deadline:
            rows = _ladder_rows(cluster, prefix)
            held = sum(max(int(r.get("messages") or 0) - int(r.get("messages_ready") or 0)
                           - int(r.get("messages_unacknowledged") or 0), 0) for r in rows)
            held_peak = max(held_peak, held)
            if time.time() >= next_report:
                say(f"    t={time.time() - start:.0f}s arrived {len(arrivals.seen)}/{confirmed}, held {held}")
                next_report = time.time() + 30
            time.sleep(2.0)
        time.sleep(2.0)  # late duplicates
        arrivals.stop.set()
        survived = worker.poll() is None
    finally:
        stop_process(worker, 30)
    said = [line for line in worker_log.read_text(errors="replace").splitlines()
            if "held" in line or "management API" in line]
    late = sorted(arrived - due for due, arrived in arrivals.seen.values())
    q = statistics.quantiles(late, n=100) if len(late) > 1 else [float("nan")] * 99
    _cleanup(cluster, workdir, env)
    return LoadResult(
        broker=_version(cluster.nodes[(victim + 1) % len(cluster.nodes)]), nodes=len(cluster.nodes), tasks=n,
        publish_s=publish_s, hit_at_s=hit_at, published=published, confirmed=confirmed,
        delivered=len(arrivals.seen), lost=len(confirmed_ids - set(arrivals.seen)), duplicates=arrivals.dupes,
        early=sum(1 for x in late if x < 0), outage_s=round(outage, 1), late_p50_s=round(q[49], 2),
        late_p90_s=round(q[89], 2), late_p99_s=round(q[98], 2), late_max_s=round(late[-1], 2) if late else -1.0,
        late_over_30s=sum(1 for x in late if x > 30), late_over_120s=sum(1 for x in late if x > 120),
        victim_leaders=f"{counts.get(target.nodename, 0)}/{sum(counts.values())}", held_peak=held_peak,
        missing=sorted(confirmed_ids - set(arrivals.seen))[:20], destination=destination, worker_survived=survived, worker_said=[line.split("] ", 1)[-1][:300] for line in said][:20])


def _cleanup(cluster: Cluster, workdir: Path, env: dict[str, str]) -> None:
    """Delete the run's ladder and destination (the cluster may serve the next run)."""
    code = ("import loadapp\nwith loadapp.app.connection_for_write() as c:\n"
            "    c.default_channel.queue_delete(loadapp.app.conf.task_default_queue)\n")
    subprocess.run([sys.executable, "-c", code], env=env, cwd=workdir, capture_output=True, timeout=120)
    subprocess.run([sys.executable, "-m", "celery", "-A", "loadapp", "delayq", "topology", "delete",
                    "--discard-messages", "--yes"], env=env, cwd=workdir, capture_output=True, timeout=300)
