"""The fault suite: kill -9, stop_app and a partition of private nodes and 3-node clusters, RabbitMQ 3.10 and 4.3.

    python -m benchmarks.faults.run                  # every scenario, results/faults.{md,json}
    python -m benchmarks.faults.run --only host      # 3.10 only (``rmq4`` = 4.3 only)
    python -m benchmarks.faults.run --fault partition --out /tmp/f  # one kind of fault

Needs root; 4.3 needs the chroot of ../shared/rmq4/start.sh. Never touches the
shared brokers. Each row: one fault during ``--tasks`` delayed tasks (delays
uniform 5-60 s), published from a separate process, confirmed, read across
the outage through a node that was not hit. ``recover`` = the operator's
``delayq topology recover`` ran every 10 s after the restart (a worker's
watcher does it by itself). The CI runs a short version as tests (``./dev test --cluster``).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from .nodes import Cluster, unavailable
from .scenario import FaultResult, run_fault

RESULTS = Path(__file__).resolve().parents[1] / "results"

#: (flavour, nodes, fault, victim, recover, dead_letter_worker_publisher_confirm_timeout in ms or None)
SCENARIOS = [
    ("host", 1, "kill9", 0, False, None),
    ("host", 1, "kill9", 0, True, None),
    ("host", 3, "kill9", 0, True, None),
    ("host", 3, "stop_app", 1, True, None),
    ("host", 3, "kill9", 0, True, 5000),
    ("host", 3, "partition", 0, True, None),
    ("host", 3, "partition", 0, True, 5000),
    ("rmq4", 1, "kill9", 0, False, None),
    ("rmq4", 3, "kill9", 0, False, None),
    ("rmq4", 3, "stop_app", 1, False, None),
    ("rmq4", 1, "kill9", 0, False, 5000),
    ("rmq4", 3, "partition", 0, False, None),
    ("rmq4", 3, "partition", 0, False, 5000),
]
_PORTS = {("host", 1): 5698, ("host", 3): 5690, ("rmq4", 1): 5699, ("rmq4", 3): 5695}

COLUMNS = ["broker", "nodes", "fault", "recover", "dlx_confirm_timeout_ms", "published", "confirmed", "delivered", "lost", "duplicates",
           "early", "outage_s", "late_p50_s", "late_p99_s", "late_max_s"]


def markdown(rows: list[dict[str, Any]], *, tasks: int, when: str) -> str:
    """The committed table (pure)."""
    lines = [
        "# Fault suite", "",
        f"`python -m benchmarks.faults.run --tasks {tasks}`, {when}, on this 2-core machine: private nodes "
        "(3-node clusters share the 2 cores). Delays uniform 5-60 s; the fault hits 3 s after publishing, "
        "the node is back 5 s later (outage = kill or stop to answering again). Lateness = arrival - due. "
        "`recover`: `delayq topology recover` runs every 10 s after the restart, as a worker's watcher does "
        "by itself; `dlx_confirm_timeout_ms`: RabbitMQ's `dead_letter_worker_publisher_confirm_timeout` "
        "(advanced.config). One run per row: a quorum queue's dead-letter worker that lost a confirm with the "
        "node waits for that timeout, which some runs meet and others do not (see the README, \"Clusters and "
        "broker restarts\"). `partition`: node 1 cut off from the other two for 5 s (no iptables here, so at "
        "Erlang distribution: each side is given a wrong cookie for the other and the link is dropped, so every "
        "reconnection fails its handshake), with `cluster_partition_handling = pause_minority`, RabbitMQ's "
        "advice for 3-node clusters; outage = cut to every node running again.", "",
        "| " + " | ".join(COLUMNS) + " | within outage + 30 s | recovery said |",
        "|" + "---|" * (len(COLUMNS) + 2),
    ]
    for row in rows:
        ok = row["lost"] == 0 and row["early"] == 0 and row["late_max_s"] <= row["outage_s"] + 30
        said = _said(row.get("recover_said") or [])
        lines.append("| " + " | ".join(str(row[c]) for c in COLUMNS) + f" | {'yes' if ok else '**no**'} | {said} |")
    return "\n".join(lines) + "\n"


def _said(texts: list[str], limit: int = 3) -> str:
    """What the recovery step said, briefly: the first sentence of each distinct answer, the first few (pure)."""
    firsts = list(dict.fromkeys(text.split(". ")[0].rstrip(".") for text in texts))
    if not firsts:
        return "-"
    more = f" (+{len(firsts) - limit} more)" if len(firsts) > limit else ""
    return f"{len(texts)} run(s) acted: " + "; ".join(firsts[:limit]) + more


@click.command()
@click.option("--tasks", default=2000, show_default=True, help="Delayed tasks per scenario.")
@click.option("--only", type=click.Choice(["host", "rmq4"]), default=None, help="One broker line only.")
@click.option("--fault", "only_fault", type=click.Choice(["kill9", "stop_app", "partition"]), default=None,
              help="One kind of fault only.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(tasks: int, only: str | None, only_fault: str | None, out: Path) -> None:
    """Run every fault scenario and write faults.md / faults.json under --out."""
    rows: list[dict[str, Any]] = []
    clusters: dict[tuple[str, int, int | None, bool], Cluster] = {}
    try:
        for flavour, size, fault, victim, recover, dlx_timeout in SCENARIOS:
            if (only and flavour != only) or (only_fault and fault != only_fault):
                continue
            why = unavailable(flavour)
            if why:
                click.echo(f"skipping {flavour}: {why}", err=True)
                continue
            key = (flavour, size, dlx_timeout, fault == "partition")
            if key not in clusters:
                for other in [k for k in clusters if k != key]:
                    clusters.pop(other).shutdown()  # one cluster at a time: 2 cores
                advanced = ",".join(
                    ([f"{{dead_letter_worker_publisher_confirm_timeout, {dlx_timeout}}}"] if dlx_timeout else [])
                    + (["{cluster_partition_handling, pause_minority}"] if fault == "partition" else []))
                clusters[key] = Cluster.start(flavour, size=size, base_port=_PORTS[(flavour, size)],
                                              prefix=f"dqf{flavour[0]}{size}", rabbit_advanced=advanced)
            click.echo(f"[{time.strftime('%H:%M:%S')}] {flavour} x{size} {fault} node {victim + 1} "
                       f"recover={recover} ...", err=True)
            result: FaultResult = run_fault(clusters[key], fault=fault, victim=victim, n=tasks, delays=(5.0, 60.0),
                                            recover=recover, workdir=Path(tempfile.mkdtemp()), settle_s=300.0)
            click.echo(f"    {result.row()}", err=True)
            rows.append({**result.row(), "dlx_confirm_timeout_ms": dlx_timeout or "default (180000)"})
    finally:
        for cluster in clusters.values():
            cluster.shutdown()
    out.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d")
    (out / "faults.json").write_text(json.dumps({"when": when, "tasks": tasks, "rows": rows}, indent=2) + "\n")
    (out / "faults.md").write_text(markdown(rows, tasks=tasks, when=when))
    click.echo(markdown(rows, tasks=tasks, when=when))


if __name__ == "__main__":
    main()
