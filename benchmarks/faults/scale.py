"""Sharded ladders against one node and a 3-node cluster: delivered/s at saturation, in one run.

    python -m benchmarks.faults.scale                 # 3.10 and 4.3, 1 and 3 nodes, 1 and 3 shards
    python -m benchmarks.faults.scale --only rmq4

For each broker line, a private single node and a private 3-node cluster are
started (one at a time: the machine has 2 cores), and on each, ladders of 1
and of 3 shards. ``--procs`` processes publish ``--tasks`` delayed tasks
inside ``celery_delayq.batch()`` (pipelined confirms), all due within one
second, ``--due`` seconds after publishing starts, so the ladder then runs
flat out with nothing else publishing. A consumer reads the destination
queue (through another node than the one published to, on a cluster).

Reported per row: the drain rate (tasks over the time from the first due
time to the last arrival), delivered/s between the 10th and 90th percentile
of arrivals, lateness, lost and early, and the CPU the broker's VMs and the whole
machine used while the ladder drained (from /proc: on a 2-core machine a
broker that uses both cores cannot go faster, however its work is spread).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import click

from ..common import process_cpu_ticks
from .burst import _Reader
from .nodes import Cluster, usable_flavours
from .scenario import REPO, _app_file, _version

RESULTS = Path(__file__).resolve().parents[1] / "results"

_PUBLISH = """
import sys, time
import celery_delayq, faultapp
n, due_at, spread_ms = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
with celery_delayq.batch(faultapp.app):
    for i in range(n):
        due = due_at + (i % spread_ms) / 1000.0
        faultapp.noop.apply_async((due,), countdown=due - time.time())
print(time.time())
"""

_PORTS = {("host", 1): 5676, ("host", 3): 5678, ("rmq4", 1): 5682, ("rmq4", 3): 5683}


@dataclass
class ScaleResult:
    """One saturation run: how fast a (sharded) ladder delivered what came due together."""

    broker: str
    nodes: int
    shards: int
    published: int
    delivered: int
    lost: int
    early: int
    publish_overran_due: bool
    drain_per_s: float
    delivered_per_s: float
    late_p50_s: float
    late_max_s: float
    broker_cpu_pct: float
    machine_cpu_pct: float


class _CpuMeter(threading.Thread):
    """CPU of some processes and of the whole machine, in % of one core, averaged while ``on`` is set."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.on, self.stop = threading.Event(), threading.Event()
        self.samples: list[tuple[float, float]] = []

    @staticmethod
    def _proc_ticks(pid: int) -> int:
        try:
            return process_cpu_ticks(pid)
        except OSError:
            return 0

    @staticmethod
    def _machine() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(values), values[3] + values[4]

    def run(self) -> None:
        hz, cores = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
        prev = (sum(self._proc_ticks(p) for p in self.pids), *self._machine(), time.monotonic())
        while not self.stop.wait(0.5):
            cur = (sum(self._proc_ticks(p) for p in self.pids), *self._machine(), time.monotonic())
            if self.on.is_set():
                procs = (cur[0] - prev[0]) / hz / (cur[3] - prev[3]) * 100
                busy = 100 * cores * (1 - (cur[2] - prev[2]) / max(1, cur[1] - prev[1]))
                self.samples.append((procs, busy))
            prev = cur

    def mean(self) -> tuple[float, float]:
        if not self.samples:
            return float("nan"), float("nan")
        return (round(statistics.fmean(s[0] for s in self.samples)), round(statistics.fmean(s[1] for s in self.samples)))


def run_saturation(cluster: Cluster, *, shards: int, tasks: int, procs: int, due_s: float,
                   workdir: Path, extra: str = "", spread_s: float = 1.0,
                   before_due: Callable[[str], None] | None = None) -> ScaleResult:
    """Publish ``tasks`` due together ``due_s`` s from now into a ladder of ``shards`` shards; time arrivals.

    ``extra``: more app settings, as keyword source (``", delayq_radix=16"``), as in ``run_burst``; ``spread_s``:
    the due times are spread evenly over this many seconds (1: "due at one moment"); ``before_due``: called
    with the ladder's prefix once every publisher has finished, before the first due time (a topology variant).
    """
    prefix = f"scale{uuid.uuid4().hex[:6]}"
    entry = cluster.nodes[0]
    _app_file(workdir, entry.url, entry.mgmt_url, prefix, shards=shards, extra=extra)
    reader = _Reader(cluster.nodes[-1].amqp_port, f"{prefix}-dest")
    reader.start()
    reader.ready.wait(30)
    env = dict(os.environ, PYTHONPATH=f"{workdir}:{REPO}")
    due_at = time.time() + due_s
    per = tasks // procs
    children = [subprocess.Popen([sys.executable, "-c", _PUBLISH, str(per), str(due_at),
                                  str(max(1, round(spread_s * 1000)))], env=env, cwd=workdir,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(procs)]
    ends = []
    for child in children:
        out, err = child.communicate(timeout=max(600, due_s * 2))
        if child.returncode != 0:
            raise RuntimeError(f"a publisher failed: {err[-3000:]}")
        ends.append(float(out.split()[-1]))
    if before_due is not None:
        before_due(prefix)
    meter = _CpuMeter([pid for node in cluster.nodes for pid in node.beam_pids()])
    meter.start()
    while time.time() < due_at:
        time.sleep(0.05)
    meter.on.set()
    published = per * procs
    deadline = time.time() + max(600, tasks / 500)
    while len(reader.seen) < published and time.time() < deadline:
        time.sleep(0.2)
    meter.stop.set()
    time.sleep(1.0)
    reader.stop.set()
    reader.join(10)
    arrivals = sorted(a for _d, a in reader.seen.values())
    late = sorted(a - d for d, a in reader.seen.values())
    m = len(arrivals)
    t10, t90 = (arrivals[int(m * 0.1)], arrivals[int(m * 0.9)]) if m >= 10 else (0.0, 0.0)
    broker_cpu, machine_cpu = meter.mean()
    return ScaleResult(
        broker=_version(entry), nodes=len(cluster.nodes), shards=shards, published=published, delivered=m,
        lost=published - m, early=sum(1 for x in late if x < 0), publish_overran_due=max(ends) > due_at,
        drain_per_s=round(m / (arrivals[-1] - due_at), 1) if m and arrivals[-1] > due_at else float("nan"),
        delivered_per_s=round(0.8 * m / (t90 - t10), 1) if t90 > t10 else float("nan"),
        late_p50_s=round(late[m // 2], 3) if late else float("nan"),
        late_max_s=round(late[-1], 3) if late else float("nan"),
        broker_cpu_pct=broker_cpu, machine_cpu_pct=machine_cpu)


COLUMNS = ["broker", "nodes", "shards", "published", "delivered", "lost", "early", "drain_per_s", "delivered_per_s",
           "late_p50_s", "late_max_s", "broker_cpu_pct", "machine_cpu_pct"]


def markdown(rows: list[dict[str, Any]], *, tasks: int, procs: int, due_s: float, when: str) -> str:
    """The committed table (pure), with each row's rate as a ratio of its broker's 1-node, 1-shard row."""
    base = {r["broker"]: r["drain_per_s"] for r in rows if r["nodes"] == 1 and r["shards"] == 1}
    lines = [
        "# Sharded ladders: one node and a 3-node cluster", "",
        f"`python -m benchmarks.faults.scale --tasks {tasks} --procs {procs} --due {due_s:g}`, {when}, on this "
        f"2-core machine (a 3-node cluster's nodes share the same 2 cores). {procs} processes publish {tasks:,} "
        f"tasks in `celery_delayq.batch()`, all due within one second, {due_s:g} s after publishing starts; the "
        "ladder then drains with nothing else publishing. drain/s: tasks over the time from the first due time "
        "to the last arrival (what decides how late the last task is); delivered/s: between the 10th and 90th "
        "percentile of arrivals. CPU: mean while draining, in % of one core (200% = both cores), for the broker VMs and for "
        "the whole machine (the consumer included). Ratio: drain/s over the same broker's 1-node, "
        "1-shard row of this run.", "",
        "| " + " | ".join(COLUMNS) + " | ratio |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row in rows:
        ratio = row["drain_per_s"] / base[row["broker"]] if base.get(row["broker"]) else float("nan")
        overran = " (publishing overran the due time)" if row["publish_overran_due"] else ""
        lines.append("| " + " | ".join(str(row[c]) for c in COLUMNS) + f" | {ratio:.2f}{overran} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--tasks", default=30_000, show_default=True, help="Tasks due together per run.")
@click.option("--procs", default=2, show_default=True, help="Publishing processes.")
@click.option("--due", "due_s", default=50.0, show_default=True, help="Seconds from publishing start to due.")
@click.option("--only", type=click.Choice(["host", "rmq4"]), default=None, help="One broker line only.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(tasks: int, procs: int, due_s: float, only: str | None, out: Path) -> None:
    """Run the saturation matrix and write scale.md / scale.json under --out."""
    rows: list[dict[str, Any]] = []
    for flavour in usable_flavours(only, say=lambda text: click.echo(text, err=True)):
        for size in (1, 3):
            with Cluster.start(flavour, size=size, base_port=_PORTS[(flavour, size)],
                               prefix=f"dqs{flavour[0]}{size}") as cluster:
                for shards in (1, 3):
                    click.echo(f"[{time.strftime('%H:%M:%S')}] {flavour} x{size} shards={shards} ...", err=True)
                    result = run_saturation(cluster, shards=shards, tasks=tasks, procs=procs, due_s=due_s,
                                            workdir=Path(tempfile.mkdtemp()))
                    click.echo(f"    {asdict(result)}", err=True)
                    rows.append(asdict(result))
    out.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d")
    text = markdown(rows, tasks=tasks, procs=procs, due_s=due_s, when=when)
    (out / "scale.json").write_text(json.dumps({"when": when, "tasks": tasks, "procs": procs, "due_s": due_s,
                                                "rows": rows}, indent=2) + "\n")
    (out / "scale.md").write_text(text)
    click.echo(text)


if __name__ == "__main__":
    main()
