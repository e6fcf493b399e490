"""The fault suite: kill -9, stop_app and a partition of private nodes and 3-node clusters, RabbitMQ 3.10 and 4.3.

    python -m benchmarks.faults.run                  # every scenario, results/faults.{md,json}
    python -m benchmarks.faults.run --only host      # 3.10 only (``rmq4`` = 4.3 only)
    python -m benchmarks.faults.run --fault partition --out /tmp/f  # one kind of fault
    python -m benchmarks.faults.run --load heavy     # kill -9 at load (:mod:`.load`), results/faults_load.json

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

from .load import LoadResult, run_load_fault
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

#: At load (issue #27): (flavour, dead_letter_worker_publisher_confirm_timeout in ms or None, task queue type).
LOAD_SCENARIOS = [("host", None, "quorum"), ("host", 5000, "quorum"), ("rmq4", None, "quorum"),
                  ("rmq40", None, "quorum"), ("host", None, "classic")]
#: Their clusters' AMQP base ports: apart from the light suite's and the cluster tests' (5690-5699).
_LOAD_PORTS = {"host": 5680, "rmq4": 5684, "rmq40": 5676}
LOAD_COLUMNS = ["broker", "dlx_confirm_timeout_ms", "destination", "worker_survived", "tasks", "published", "confirmed", "delivered", "lost",
                "duplicates", "early", "victim_leaders", "outage_s", "held_peak", "late_p50_s", "late_p90_s",
                "late_p99_s", "late_max_s", "late_over_30s", "late_over_120s"]

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


def load_markdown(doc: dict[str, Any]) -> str:
    """The at-load table (pure): ``doc`` as :func:`main` writes ``faults_load.json``."""
    rows = doc.get("rows", [])
    if not rows:
        return ""
    lines = [
        "## At load (issue #27)", "",
        f"`python -m benchmarks.faults.run --load heavy --tasks {doc.get('tasks')}`, {doc.get('when')}: a private "
        "3-node cluster (management on every node), an app whose `broker_url` lists the three nodes and whose "
        "management URL names node 2, leaders spread, a delayq worker running (its held-message watcher on), "
        f"{doc.get('tasks')} tasks with countdowns uniform 5-60 s published at an even rate over 15 s; at t = 15 s "
        "kill -9 of the node leading most ladder queues, back 20 s later. Lateness = arrival - due, read through "
        "the other nodes. `held_peak`: most messages the ladder's queues held in their dead-letter state at once "
        "(`messages` - ready - unacked). " + str(doc.get("conditions") or ""), "",
        "Why 3.10 with the default timeout is **no**: a dead-letter worker's first publish to a target queue asks "
        "the target's first member, and is rejected when that node is down (RabbitMQ before 3.12.5, "
        "`rabbit_fifo_client:enqueue/3`); a rejected message is sent again only once "
        "`dead_letter_worker_publisher_confirm_timeout` has passed since it was sent, whether the timer or a policy "
        "change wakes the worker (`rabbit_fifo_dlx_worker:redeliver_messages/1`), and 32 of them (its prefetch) hold "
        "everything behind them: 180-360 s. The worker's policy touch cannot shorten it; `advanced.config` can "
        "(the 5000 ms rows). 4.0.5 and 4.3.6 are late by about the outage. See docs/clusters.md.", "",
        "| " + " | ".join(LOAD_COLUMNS) + " | within outage + 30 s |",
        "|" + "---|" * (len(LOAD_COLUMNS) + 1),
    ]
    notes: list[str] = []
    for row in rows:
        ok = row["lost"] == 0 and row["early"] == 0 and row["late_max_s"] <= row["outage_s"] + 30
        mark = ""
        if row.get("note"):
            notes.append(f"{len(notes) + 1}. {row['note']}")
            mark = f" ({len(notes)})"
        lines.append("| " + " | ".join(str(row.get(c)) for c in LOAD_COLUMNS) + f" | {'yes' if ok else '**no**'}{mark} |")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _said(texts: list[str], limit: int = 3) -> str:
    """What the recovery step said, briefly: the first sentence of each distinct answer, the first few (pure)."""
    firsts = list(dict.fromkeys(text.split(". ")[0].rstrip(".") for text in texts))
    if not firsts:
        return "-"
    more = f" (+{len(firsts) - limit} more)" if len(firsts) > limit else ""
    return f"{len(texts)} run(s) acted: " + "; ".join(firsts[:limit]) + more


@click.command()
@click.option("--tasks", default=2000, show_default=True, help="Delayed tasks per scenario.")
@click.option("--only", type=click.Choice(["host", "rmq4", "rmq40"]), default=None,
              help="One broker line only (rmq40: 4.0 from the trixie chroot, at load only).")
@click.option("--fault", "only_fault", type=click.Choice(["kill9", "stop_app", "partition"]), default=None,
              help="One kind of fault only.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
@click.option("--load", type=click.Choice(["light", "heavy"]), default="light", show_default=True,
              help="light: every fault, tasks published before it; heavy: kill -9 at load (5,000 tasks by default, "
                   "delays over a minute, the fault while they flow), RabbitMQ 3.10 and 4.3.")
@click.option("--conditions", default="", help="Heavy: a note on the machine's state during the run, for the table.")
@click.option("--destination", type=click.Choice(["quorum", "classic"]), default=None,
              help="Heavy: only the scenarios whose task queue is of this type.")
@click.option("--dlx-timeout", "dlx_timeout", type=int, default=None,
              help="Heavy: only the scenarios with this dead_letter_worker_publisher_confirm_timeout (0 = default).")
def main(tasks: int, only: str | None, only_fault: str | None, out: Path, load: str, conditions: str,
         destination: str | None, dlx_timeout: int | None) -> None:
    """Run the fault scenarios and write faults.md (both loads) / faults.json or faults_load.json under --out."""
    if load == "heavy":
        _main_heavy(tasks if tasks != 2000 else 5000, only, out, conditions, destination, dlx_timeout)
        return
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
    _write_md(out, markdown(rows, tasks=tasks, when=when))


def _write_md(out: Path, light: str) -> None:
    """faults.md: the light table, then the at-load one (each from its own run's JSON)."""
    heavy = out / "faults_load.json"
    text = light + ("\n" + load_markdown(json.loads(heavy.read_text())) if heavy.exists() else "")
    (out / "faults.md").write_text(text)
    click.echo(text)


def _main_heavy(tasks: int, only: str | None, out: Path, conditions: str, only_destination: str | None = None,
                only_timeout: int | None = None) -> None:
    rows: list[dict[str, Any]] = []
    for flavour, dlx_timeout, destination in LOAD_SCENARIOS:
        if (only and flavour != only) or (only_destination and destination != only_destination) \
                or (only_timeout is not None and (dlx_timeout or 0) != only_timeout):
            continue
        why = unavailable(flavour)
        if why:
            click.echo(f"skipping {flavour}: {why}", err=True)
            continue
        advanced = f"{{dead_letter_worker_publisher_confirm_timeout, {dlx_timeout}}}" if dlx_timeout else ""
        click.echo(f"[{time.strftime('%H:%M:%S')}] {flavour} x3 kill9 at load, dlx timeout {dlx_timeout} ...",
                   err=True)
        with Cluster.start(flavour, size=3, base_port=_LOAD_PORTS[flavour], prefix=f"dql{flavour[0]}{flavour[4:]}",
                           rabbit_advanced=advanced) as cluster:
            result: LoadResult = run_load_fault(cluster, n=tasks, workdir=Path(tempfile.mkdtemp()),
                                                destination=destination,
                                                say=lambda text: click.echo(text, err=True))
        click.echo(f"    {result.row()}", err=True)
        rows.append({**result.row(), "dlx_confirm_timeout_ms": dlx_timeout or "default (180000)"})
    out.mkdir(parents=True, exist_ok=True)
    heavy = out / "faults_load.json"
    old = json.loads(heavy.read_text()).get("rows", []) if heavy.exists() else []
    keep = [r for r in old if not any(r.get("broker", "").split(".")[:2] == n.get("broker", "").split(".")[:2]
                                      and r.get("dlx_confirm_timeout_ms") == n.get("dlx_confirm_timeout_ms")
                                      and r.get("destination", "classic") == n.get("destination")
                                      for n in rows)]
    doc = {"when": time.strftime("%Y-%m-%d"), "tasks": tasks, "conditions": conditions, "rows": keep + rows}
    heavy.write_text(json.dumps(doc, indent=2) + "\n")
    light = out / "faults.md"
    text = light.read_text() if light.exists() else ""
    text = text.split("\n## At load (issue #27)")[0].rstrip("\n") + "\n"
    _write_md(out, text)


if __name__ == "__main__":
    main()
