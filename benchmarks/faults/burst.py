"""The same-due burst: many short-lived processes schedule tasks that all come due together.

    python -m benchmarks.faults.burst                       # both lines: unsharded, and 4 shards
    python -m benchmarks.faults.burst --only rmq4 --runs 5  # RabbitMQ 4.3 only
    python -m benchmarks.faults.burst --settings prefetch512  # a broker setting, to compare

``--procs`` processes each publish ``--tasks / --procs`` delayed tasks with the
same ``countdown`` through ``apply_async``, once with a confirm per call (as a
web process does) and once inside ``celery_delayq.batch()`` (pipelined
confirms, so the burst comes due faster than the ladder drains it). Every
task passes the same ladder queues (for 2 s: ``L03.d3`` and ``L01.d2``). A
consumer with a 1,000 prefetch reads the destination queue and times each
arrival against its due time. While the burst drains, the management API is
sampled for the ladder queue that holds the most ready messages: that
queue's dead-letter worker is what paces the burst.

Rows run on a private single node per broker line and settings (wiped
first). Never touches the shared brokers.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from base64 import b64encode
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import amqp
import click

from .nodes import Cluster, usable_flavours
from .scenario import REPO, Arrivals, _app_file, _version

RESULTS = Path(__file__).resolve().parents[1] / "results"

_PUBLISH = """
import sys, time
import celery_delayq, faultapp
n, countdown, batched = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
def send():
    for i in range(n):
        faultapp.noop.apply_async((time.time() + countdown,), countdown=countdown)
if batched:
    with celery_delayq.batch(faultapp.app):
        send()
else:
    send()
"""

#: label -> (delayq_shards, advanced.config terms for the rabbit application, more app settings)
SETTINGS = {"defaults": (1, "", ""), "shards4": (4, "", ""),
            "prefetch512": (1, "{dead_letter_worker_consumer_prefetch, 512}", ""),
            "fixed": (1, "", ", delayq_backend='fixed'"), "buckets": (1, "", ", delayq_backend='buckets'"),
            "ladder": (1, "", ", delayq_backend='ladder'"), "window100": (1, "", ", delayq_batch_window=100")}
_PORTS = {"host": 5686, "rmq4": 5687}


@dataclass
class BurstResult:
    """What one burst did: counts, lateness of the last task, and the queue that paced it."""

    broker: str
    settings: str
    publish: str
    published: int
    delivered: int
    lost: int
    duplicates: int
    early: int
    publish_s: float
    late_p50_s: float
    late_p99_s: float
    late_max_s: float
    hot_queue: str
    hot_queue_peak_ready: int
    #: ``--trace``: a sample every 0.5 s, ``t`` from the start: :func:`_sample`'s counts, ``due`` (tasks due by
    #: then) and ``arrived`` (read by the consumer by then).
    trace: list[dict[str, float]] | None = None


class _Reader(Arrivals):
    """Consumes the destination queue (prefetch 1,000) through one node, recording due and arrival per task id."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__([port], queue)
        self.port = port
        self.ready = threading.Event()

    def run(self) -> None:
        conn = amqp.Connection(f"127.0.0.1:{self.port}", connect_timeout=5)
        conn.connect()
        ch = conn.channel()
        ch.queue_declare(self.queue, durable=True, auto_delete=False)
        ch.basic_qos(0, 1000, False)

        def got(msg: Any) -> None:
            self.record(msg, time.time())
            ch.basic_ack(msg.delivery_tag)

        ch.basic_consume(self.queue, callback=got)
        self.ready.set()
        try:
            while not self.stop.is_set():
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    continue
        finally:
            conn.collect()


def _get(url: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.load(resp)


def _sample(mgmt_url: str, prefix: str) -> tuple[str, int, dict[str, int]]:
    """The delay queue holding the most ready messages now, and where the burst's messages are: ``waiting``
    (every queue of the prefix but the destination), ``ready`` (of those, expired and not yet dead-lettered
    on 3.x, or dead-lettering), ``dest`` (in the destination, not yet read by the consumer) and ``published``
    (the node's count of client publishes so far). Management API; empty on a failed read."""
    try:
        rows = _get(f"{mgmt_url}/api/queues?columns=name,messages,messages_ready")
        stats = _get(f"{mgmt_url}/api/overview?columns=message_stats").get("message_stats") or {}
    except (OSError, ValueError):  # a busy node's API may time out or answer 500: skip this sample
        return "", 0, {}
    delay = [r for r in rows if r["name"].startswith(prefix + ".")]
    dest = [r for r in rows if r["name"] == f"{prefix}-dest"]
    where = {"waiting": sum(int(r.get("messages") or 0) for r in delay),
             "ready": sum(int(r.get("messages_ready") or 0) for r in delay),
             "dest": sum(int(r.get("messages") or 0) for r in dest),
             "published": int(stats.get("publish") or 0)}
    if not delay:
        return "", 0, where
    ready, name = max((int(r.get("messages_ready") or 0), r["name"]) for r in delay)
    return name, ready, where


def run_burst(node: Any, *, settings: str, tasks: int, procs: int, countdown: float, workdir: Path,
              batched: bool = False, shards: int = 1, settle_s: float = 300.0, extra: str = "",
              reader_class: type[_Reader] | None = None, trace: bool = False) -> BurstResult:
    """One burst against ``node``: publish from ``procs`` processes, time every arrival.

    ``extra``: more app settings (``", delayq_backend='fixed'"``); ``reader_class``: a
    :class:`_Reader` that records more per arrival (the caller keeps it as ``run_burst.reader``).
    """
    prefix = f"burst{uuid.uuid4().hex[:6]}"
    _app_file(workdir, node.url, node.mgmt_url, prefix, shards=shards, extra=extra)
    reader = (reader_class or _Reader)(node.amqp_port, f"{prefix}-dest")
    run_burst.reader = reader  # type: ignore[attr-defined]
    reader.start()
    reader.ready.wait(30)
    env = dict(os.environ, PYTHONPATH=f"{workdir}:{REPO}")
    per = tasks // procs
    start = time.time()
    children = [subprocess.Popen([sys.executable, "-c", _PUBLISH, str(per), str(countdown), "1" if batched else "0"], env=env, cwd=workdir,
                                 stderr=subprocess.PIPE, text=True) for _ in range(procs)]
    hot, peak = "", 0
    samples: list[dict[str, float]] = []

    def look() -> None:
        nonlocal hot, peak
        at = time.time()
        name, ready, where = _sample(node.mgmt_url, prefix)
        if ready > peak:
            hot, peak = name, ready
        if trace and where:
            samples.append({"t": round(at - start, 2), "arrived": len(reader.seen), **where})
        time.sleep(0.5)

    while any(c.poll() is None for c in children):
        look()
    publish_s = time.time() - start
    for child in children:
        if child.returncode != 0:
            raise RuntimeError(f"a publisher failed: {(child.stderr.read() if child.stderr else '')[-3000:]}")
    published = per * procs
    deadline = time.time() + settle_s
    while len(reader.seen) < published and time.time() < deadline:
        look()
    time.sleep(1.0)  # late duplicates
    reader.stop.set()
    reader.join(10)
    late = sorted(arrived - due for due, arrived in reader.seen.values())
    dues = sorted(due - start for due, _ in reader.seen.values())
    for sample in samples:
        sample["due"] = bisect.bisect_right(dues, sample["t"])
    q = statistics.quantiles(late, n=100) if len(late) > 1 else [float("nan")] * 99
    return BurstResult(
        broker=_version(node), settings=settings, publish="batch" if batched else "confirm-each", published=published, delivered=len(reader.seen),
        lost=published - len(reader.seen), duplicates=reader.dupes, early=sum(1 for x in late if x < 0),
        publish_s=round(publish_s, 1), late_p50_s=round(q[49], 3), late_p99_s=round(q[98], 3),
        late_max_s=round(late[-1], 3) if late else float("nan"), hot_queue=hot.removeprefix(prefix + "."),
        hot_queue_peak_ready=peak, trace=samples if trace else None)


COLUMNS = ["broker", "settings", "publish", "published", "delivered", "lost", "duplicates", "early", "publish_s",
           "late_p50_s", "late_p99_s", "late_max_s", "hot_queue", "hot_queue_peak_ready"]


def markdown(rows: list[dict[str, Any]], *, tasks: int, procs: int, countdown: float, when: str,
             goal_s: float) -> str:
    """The committed table (pure)."""
    lines = [
        "# Same-due burst", "",
        f"`python -m benchmarks.faults.burst --tasks {tasks} --procs {procs} --countdown {countdown:g}`, {when}, "
        f"on this 2-core machine, one private node per broker and settings (wiped first). {procs} processes each "
        f"publish {tasks // procs:,} tasks with `apply_async(countdown={countdown:g})`, so all of them pass the same "
        "ladder queues; `publish`: `confirm-each` (a confirm per call, as a web process does) or `batch` "
        "(inside `celery_delayq.batch()`, pipelined confirms: the burst comes due faster than the ladder drains it). "
        "A consumer (prefetch 1,000) times each arrival. Lateness = arrival - due. `hot_queue`: the ladder queue "
        "with the most ready messages while it drained; its dead-letter worker paced the burst. `settings`: "
        + "; ".join(f"`{k}` = delayq_shards {n}{extra}, "
                    f"{('advanced.config ' + v) if v else 'RabbitMQ defaults'}"
                    for k, (n, v, extra) in SETTINGS.items())
        + ". `hot_queue` names shard 0's queue when sharded (`.sN.` for shard N).", "",
        "| " + " | ".join(COLUMNS) + f" | last ≤ {goal_s:g} s late |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row in rows:
        ok = row["lost"] == 0 and row["early"] == 0 and row["late_max_s"] <= goal_s
        lines.append("| " + " | ".join(str(row[c]) for c in COLUMNS) + f" | {'yes' if ok else '**no**'} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--tasks", default=10_000, show_default=True, help="Tasks in the burst.")
@click.option("--procs", default=4, show_default=True, help="Publishing processes.")
@click.option("--countdown", default=2.0, show_default=True, help="The one countdown of every task, seconds.")
@click.option("--runs", default=3, show_default=True, help="Runs per broker, settings and publish mode.")
@click.option("--only", type=click.Choice(["host", "rmq4"]), default=None, help="One broker line only.")
@click.option("--settings", "settings", type=click.Choice(sorted(SETTINGS)), multiple=True,
              default=["defaults", "shards4"], show_default=True, help="Broker settings to run (repeatable).")
@click.option("--goal", default=10.0, show_default=True, help="Lateness of the last task the run must meet, s.")
@click.option("--trace", is_flag=True, help="Sample where the burst's messages are every 0.5 s (burst_trace.json).")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(tasks: int, procs: int, countdown: float, runs: int, only: str | None, settings: tuple[str, ...],
         goal: float, trace: bool, out: Path) -> None:
    """Run the burst on private nodes and write burst.md / burst.json under --out."""
    rows: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []
    for flavour in usable_flavours(only, say=lambda text: click.echo(text, err=True)):
        for label in settings:
            shards, advanced, extra = SETTINGS[label]
            if trace:  # the management API's counts every 0.5 s, not 5 s, so the samples see the burst move
                advanced = ", ".join(filter(None, [advanced, "{collect_statistics_interval, 500}"]))
            with Cluster.start(flavour, size=1, base_port=_PORTS[flavour], prefix=f"dqb{flavour[0]}",
                               rabbit_advanced=advanced) as cluster:
                for i in range(runs):
                    for batched in (False, True):
                        mode = "batch" if batched else "confirm-each"
                        click.echo(f"[{time.strftime('%H:%M:%S')}] {flavour} {label} {mode} run {i + 1}/{runs} ...",
                                   err=True)
                        result = run_burst(cluster.nodes[0], settings=label, tasks=tasks, procs=procs,
                                           countdown=countdown, batched=batched, shards=shards,
                                           workdir=Path(tempfile.mkdtemp()), extra=extra, trace=trace)
                        row = asdict(result)
                        if trace:
                            traces.append({k: row[k] for k in ("broker", "settings", "publish", "late_max_s")}
                                          | {"trace": row["trace"]})
                        row.pop("trace")
                        click.echo(f"    {row}", err=True)
                        rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d")
    text = markdown(rows, tasks=tasks, procs=procs, countdown=countdown, when=when, goal_s=goal)
    (out / "burst.json").write_text(json.dumps({"when": when, "tasks": tasks, "procs": procs,
                                                "countdown": countdown, "rows": rows}, indent=2) + "\n")
    (out / "burst.md").write_text(text)
    if trace:
        (out / "burst_trace.json").write_text(json.dumps({"when": when, "runs": traces}) + "\n")
    click.echo(text)


if __name__ == "__main__":
    main()
