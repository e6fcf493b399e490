"""The ladder beside the ``fixed`` backend: the same burst of tasks with one countdown, in one run.

    python -m benchmarks.faults.backends                     # both lines, 10,000 tasks, countdown 2 s
    python -m benchmarks.faults.backends --only rmq4 --tasks 5000

For each broker line one private single node (wiped first, ports of its own)
takes, per backend and run, the burst of :mod:`benchmarks.faults.burst`:
``--procs`` processes publish ``--tasks`` tasks with the same countdown inside
``celery_delayq.batch()`` (pipelined confirms, so the burst comes due faster
than the broker moves it), through the default ladder (``delayq_backend =
"ladder"``) and through one TTL queue per delay (``"fixed"``). A consumer
times each arrival and counts its hops from the broker's own ``x-death``
header (one per dead-lettering: each level queue, the exit queue, or the one
fixed queue). Reported: drain rate (tasks over the time from the first due
time to the last arrival), hops per task, lateness p50/p99/max, and each
figure of ``fixed`` as a ratio of the ladder's in the same run and broker.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from .burst import _Reader, run_burst
from .nodes import Cluster, usable_flavours

RESULTS = Path(__file__).resolve().parents[1] / "results"
_PORTS = {"host": 5696, "rmq4": 5697}
BACKENDS = {"ladder": ", delayq_backend='ladder'", "fixed": ", delayq_backend='fixed'"}


class _HopReader(_Reader):
    """A :class:`_Reader` that also records each arrival's dead-letterings (``x-death`` counts)."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(port, queue)
        self.hops: list[int] = []

    def record(self, msg: Any, now: float) -> None:
        deaths = (msg.headers or {}).get("x-death") or []
        self.hops.append(sum(int(d.get("count") or 1) for d in deaths))
        super().record(msg, now)


def run_pair(node: Any, *, tasks: int, procs: int, countdown: float) -> list[dict[str, Any]]:
    """One burst through each backend on ``node``, the ladder first."""
    rows = []
    for backend, extra in BACKENDS.items():
        due_first = time.time()
        result = run_burst(node, settings=backend, tasks=tasks, procs=procs, countdown=countdown, batched=True,
                           workdir=Path(tempfile.mkdtemp()), extra=extra, reader_class=_HopReader)
        reader: _HopReader = run_burst.reader  # type: ignore[attr-defined]
        seen = reader.seen
        dues, arrivals = [d for d, _ in seen.values()], [a for _, a in seen.values()]
        first_due = min(dues) if dues else due_first
        drain = round(len(arrivals) / (max(arrivals) - first_due), 1) if arrivals and max(arrivals) > first_due \
            else float("nan")
        row = asdict(result)
        row.pop("trace")
        row.update(backend=backend, countdown=countdown, drain_per_s=drain,
                   hops_per_task=round(statistics.fmean(reader.hops), 2) if reader.hops else float("nan"))
        rows.append(row)
    return rows


COLUMNS = ["broker", "countdown", "backend", "published", "delivered", "lost", "duplicates", "early", "publish_s",
           "drain_per_s", "hops_per_task", "late_p50_s", "late_p99_s", "late_max_s"]
RATIOS = ["drain_per_s", "hops_per_task", "late_p50_s", "late_p99_s"]


def markdown(rows: list[dict[str, Any]], *, tasks: int, procs: int, countdowns: tuple[float, ...], when: str,
             argv: str) -> str:
    """The committed table (pure), and fixed/ladder ratios per broker and run."""
    lines = [
        "# The ladder and the `fixed` backend: one burst, one countdown", "",
        f"`python -m benchmarks.faults.backends {argv}`, {when}, on this shared 2-core machine, one private node "
        f"per broker line (wiped first). {procs} processes publish {tasks:,} tasks with `apply_async(countdown=C)` "
        f"(C = {', '.join(f'{c:g}' for c in countdowns)} s) inside `celery_delayq.batch()`, through the default ladder "
        "and through `fixed` (one TTL queue per destination and delay). When publishing takes longer than C, "
        "tasks come due as they are published and drain/s is paced by the publishers (lateness then says whether "
        "the broker kept up); with C longer than publishing, the whole burst is due at once and drain/s is the "
        "broker's. drain/s: tasks over the time from the first due time to the last "
        "arrival; hops: dead-letterings per task counted from the broker's `x-death` header; lateness = arrival "
        "- due, at a consumer with prefetch 1,000.", "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        lines.append("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    lines += ["", "Ratios fixed / ladder (same broker and countdown, consecutive runs):", "",
              "| broker | countdown | run | publish_s | " + " | ".join(RATIOS) + " |", "|" + "---|" * (len(RATIOS) + 4)]
    ladders = [r for r in rows if r["backend"] == "ladder"]
    fixeds = [r for r in rows if r["backend"] == "fixed"]
    counts: dict[tuple[str, float], int] = {}
    for lad, fix in zip(ladders, fixeds):
        key = (lad["broker"], lad["countdown"])
        counts[key] = counts.get(key, 0) + 1
        cells = [f"{fix[c] / lad[c]:.2f}" if lad[c] else "n/a" for c in ["publish_s", *RATIOS]]
        lines.append(f"| {lad['broker']} | {lad['countdown']:g} | {counts[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--tasks", default=10_000, show_default=True, help="Tasks in the burst.")
@click.option("--procs", default=2, show_default=True, help="Publishing processes.")
@click.option("--countdown", "countdowns", type=float, multiple=True, default=[2.0], show_default=True,
              help="The one countdown of every task of a burst, seconds (repeatable: one pair per value).")
@click.option("--runs", default=1, show_default=True, help="Pairs (ladder, fixed) per broker line.")
@click.option("--only", type=click.Choice(["host", "rmq4"]), default=None, help="One broker line only.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(tasks: int, procs: int, countdowns: tuple[float, ...], runs: int, only: str | None, out: Path) -> None:
    """Run the pairs on private nodes and write backend_fixed.md / .json under --out."""
    rows: list[dict[str, Any]] = []
    for flavour in usable_flavours(only, say=lambda text: click.echo(text, err=True)):
        with Cluster.start(flavour, size=1, base_port=_PORTS[flavour], prefix=f"dqf{flavour[0]}") as cluster:
            for countdown in countdowns:
                for i in range(runs):
                    click.echo(f"[{time.strftime('%H:%M:%S')}] {flavour} countdown {countdown:g} pair {i + 1}/{runs}",
                               err=True)
                    for row in run_pair(cluster.nodes[0], tasks=tasks, procs=procs, countdown=countdown):
                        click.echo(f"    {row}", err=True)
                        rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d")
    argv = (f"--tasks {tasks} --procs {procs} " + " ".join(f"--countdown {c:g}" for c in countdowns)
            + f" --runs {runs}" + (f" --only {only}" if only else ""))
    text = markdown(rows, tasks=tasks, procs=procs, countdowns=countdowns, when=when, argv=argv)
    (out / "backend_fixed.json").write_text(json.dumps({"when": when, "tasks": tasks, "procs": procs,
                                                        "countdowns": countdowns, "rows": rows}, indent=2) + "\n")
    (out / "backend_fixed.md").write_text(text)
    click.echo(text)


if __name__ == "__main__":
    main()
