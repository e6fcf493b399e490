"""Ladder shapes and dead-letter prefetch at saturation, both broker lines, in one run.

    python -m benchmarks.faults.shapes                          # 14x4, 10x8, 7x16; prefetch 32 and 512
    python -m benchmarks.faults.shapes --shapes 14x4,7x16 --prefetch 32 --only rmq4
    python -m benchmarks.faults.shapes --shapes 14x4,7x16,fixed --prefetch 32 --name shapes_quiet
    python -m benchmarks.faults.shapes --tasks 1000000 --shapes fixed,7x16,14x4 --prefetch 32 --only rmq4 \
        --due 480 --spread 60 --fixed-queues 600 --name million     # 1,000,000 due within one minute

For each broker line one private single node per dead-letter prefetch
(``dead_letter_worker_consumer_prefetch`` in advanced.config; 32 is
RabbitMQ's default) is started, on base ports 5760+ (nobody else's), and on
it a ladder of each shape takes a burst of ``--tasks`` tasks all due within
one second (:func:`benchmarks.faults.scale.run_saturation`: 2 processes
publish in ``celery_delayq.batch()``, then the ladder drains with nothing else
publishing). Per shape the table also gives what does not need a broker:
the mean hops per task (queues waited in, the exit queue included) for delays
uniform over 1-5 s, 1-60 s and 1-300 s at every 10 ms unit; the level queues
one ladder has; on RabbitMQ 3.x the file handles it reserves (3 per quorum
queue, the unroutable queue included) and how many such ladders fit a node
at Debian's 1024 open files (budget 927, a tenth kept for connections:
:mod:`celery_delayq.budget`).
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

from celery_delayq.config import DelayqConfig
from celery_delayq.rabbitmq.budget import headroom
from celery_delayq.ladder.spec import LadderSpec

from .nodes import Cluster, usable_flavours
from .scale import RESULTS, run_saturation

#: A 3.10 node's file-handle cache limit at ``ulimit -n`` 1024 (measured: docs/footprint.md).
BUDGET_1024 = 927
#: Handles a quorum queue reserves on a single 3.x node (2 + members).
PER_QUORUM_QUEUE = 3
_BASE_PORT = {"host": 5760, "rmq4": 5770}


#: The ``--shapes`` name of the ``fixed`` backend (one TTL queue per distinct delay, 1 hop), compared in the same run.
FIXED = "fixed"
#: Fixed-delay queues each publisher may create in a burst (the default 16 would send the rest through the ladder).
FIXED_QUEUES = 64


#: The ``--shapes`` name of the ``buckets`` backend (one queue per destination and due second, 1 hop);
#: ``buckets-s8`` spreads each due second over 8 queues (``delayq_bucket_shards``), ``-a100`` sends the first 100
#: of a slice through the ladder (``delayq_bucket_after``), ``-q512`` allows 512 alive (``delayq_bucket_queues``).
BUCKETS = "buckets"


def bucket_settings(shape: str) -> str:
    """App settings of a ``buckets`` shape name (pure): ``buckets-s4-a100`` is 4 shards, after 100 per slice."""
    words = {"s": "delayq_bucket_shards", "a": "delayq_bucket_after", "q": "delayq_bucket_queues"}
    return "".join(f", {words[w[0]]}={int(w[1:])}" for w in shape.split("-")[1:])


def bucket_costs(shape: str) -> dict[str, Any]:
    """Broker-free facts of the ``buckets`` backend (pure): 1 hop; queues are per due second (and shard)."""
    return {**fixed_costs(), "shape": shape, "max_delay_days": round(DelayqConfig().bucket_max_delay / 86400, 3),
            "level_queues": "per due second", "handles_3x": "3 per due second"}


#: The ``--shapes`` name of whatever the package's defaults are (no backend or shape setting at all).
DEFAULT = "default"


#: A shape suffix: the same ladder, its last level dead-lettering straight into the destination queue (no exit hop).
NO_EXIT = "-noexit"


def skip_exit_hop(node: Any, levels: int, radix: int) -> Any:
    """A ``before_due`` hook: bind the destination queue to the delivery exchange, unbind its exit queue.

    The lever of issue #35 measured before it is built: what the ladder's last hop (the exit queue, paid by
    every task) costs at saturation. Safe here because the destination's exchange and key reach one queue.
    """
    import json
    import urllib.request

    import amqp

    def hook(prefix: str) -> None:
        spec = LadderSpec(prefix=prefix, levels=levels, radix=radix)
        dest = f"{prefix}-dest"
        request = urllib.request.Request(f"{node.mgmt_url}/api/exchanges/%2F/{spec.delivery_exchange}/bindings/source",
                                         headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
        with urllib.request.urlopen(request, timeout=30) as answer:
            bindings = json.load(answer)
        exits = [b for b in bindings if ".exit." in b["destination"] and dest in b["destination"]]
        if len(exits) != 1:
            raise RuntimeError(f"expected one exit queue of {dest} bound to {spec.delivery_exchange}, found {exits}")
        exit_queue, key = exits[0]["destination"], exits[0]["routing_key"]
        conn = amqp.Connection(f"127.0.0.1:{node.amqp_port}", userid="guest", password="guest")
        conn.connect()
        try:
            ch = conn.channel()
            ch.queue_bind(dest, spec.delivery_exchange, key)
            ch.queue_unbind(exit_queue, spec.delivery_exchange, key)
        finally:
            conn.close()

    return hook


def fixed_costs() -> dict[str, Any]:
    """Broker-free facts of the ``fixed`` backend (pure): 1 hop whatever the delay; queues are per distinct delay."""
    return {"shape": FIXED, "max_delay_days": round(DelayqConfig().fixed_max_delay / 86400, 3), "hops_1_5s": 1.0, "hops_1_60s": 1.0,
            "hops_1_300s": 1.0, "level_queues": "per delay", "handles_3x": "3 per delay",
            "ladders_per_1024fd_node": "n/a"}


def shape_costs(levels: int, radix: int, unit_ms: int = 10) -> dict[str, Any]:
    """Broker-free facts of one shape (pure): hops for typical delays, queues, 3.x handles, max delay."""
    spec = LadderSpec(prefix="x", levels=levels, radix=radix, unit_ms=unit_ms)
    per_s = 1000 // unit_ms

    def mean_hops(lo_s: int, hi_s: int) -> float:
        return round(statistics.fmean(spec.hops(u) for u in range(lo_s * per_s, hi_s * per_s + 1)), 2)

    queues = levels * (radix - 1)
    handles = (queues + 1) * PER_QUORUM_QUEUE
    return {"shape": f"{levels}x{radix}", "max_delay_days": round(spec.max_delay_s / 86400, 1),
            "hops_1_5s": mean_hops(1, 5), "hops_1_60s": mean_hops(1, 60), "hops_1_300s": mean_hops(1, 300),
            "level_queues": queues, "handles_3x": handles,
            "ladders_per_1024fd_node": (BUDGET_1024 - headroom(BUDGET_1024)) // handles}


COLUMNS = ["broker", "dl_prefetch", "shape", "max_delay_days", "hops_1_5s", "hops_1_60s", "hops_1_300s",
           "level_queues", "handles_3x", "ladders_per_1024fd_node", "published", "delivered", "lost", "early",
           "drain_per_s", "delivered_per_s", "late_p50_s", "late_max_s", "broker_cpu_pct", "broker_cpu_us_per_task"]


def cpu_per_task(row: dict[str, Any]) -> float:
    """Broker CPU per delivered task, in µs: its mean CPU while draining over the drain rate (pure).

    The machine is shared, so a starved broker drains slower at the same cost
    per task; this is the number that compares shapes across noisy runs.
    """
    rate, cpu = row["drain_per_s"], row["broker_cpu_pct"]
    return round(cpu / 100 * 1e6 / rate) if rate and rate == rate and cpu == cpu else float("nan")


def markdown(rows: list[dict[str, Any]], *, tasks: int, when: str, argv: str, due_s: float = 50.0,
             spread_s: float = 1.0) -> str:
    """The committed table (pure); ratio = drain/s over the same broker's 14x4, prefetch-32 row of this run."""
    base = {r["broker"]: r["drain_per_s"] for r in rows if r["shape"] == "14x4" and r["dl_prefetch"] == 32}
    lines = [
        "# Ladder shapes and dead-letter prefetch at saturation", "",
        f"`{argv}`, {when}, on this 2-core machine, one private node per broker line and dead-letter prefetch "
        f"(`dead_letter_worker_consumer_prefetch`, RabbitMQ's default 32). 2 processes publish {tasks:,} tasks in "
        f"`celery_delayq.batch()`, all due within {spread_s:g} s, {due_s:g} s after publishing starts; the ladder "
        "then drains with nothing else publishing; a consumer (prefetch 1,000) times each arrival. drain/s: tasks over the time "
        "from the first due time to the last arrival; delivered/s: between the 10th and 90th percentile of arrivals. "
        "hops: mean queues waited in (the exit queue included) for delays uniform over the range at 10 ms units. "
        "handles_3x: file handles one ladder reserves on RabbitMQ 3.x (3 per quorum queue, the unroutable queue "
        "included; exit queues add 3 each); ladders_per_1024fd_node: how many fit a node at Debian's 1024 open "
        "files (budget 927 less a tenth for connections). RabbitMQ 4.x reserves none. Ratio: drain/s over the "
        "same broker's 14x4 (the shape of ddf578f), prefetch-32 row; ÷ fixed: over the `fixed` backend's row of "
        "the same broker and prefetch (the one-hop rate issue #35 measures the default against). A `-noexit` shape "
        "is the same ladder with its destination queue bound to the delivery exchange in place of the exit queue "
        "(no exit hop). broker_cpu_us_per_task: the broker's mean CPU "
        "while draining over drain/s (the machine is shared with other work: a starved broker drains slower at the "
        "same cost per task).", "",
        "| " + " | ".join(COLUMNS) + " | ratio | ÷ fixed |",
        "|" + "---|" * (len(COLUMNS) + 2),
    ]
    fixed = {(r["broker"], r["dl_prefetch"]): r["drain_per_s"] for r in rows if r["shape"] == FIXED}
    for row in rows:
        ratio = row["drain_per_s"] / base[row["broker"]] if base.get(row["broker"]) else float("nan")
        over = fixed.get((row["broker"], row["dl_prefetch"]))
        of_fixed = f"{row['drain_per_s'] / over:.2f}" if over else "–"
        lines.append("| " + " | ".join(str(row[c]) for c in COLUMNS) + f" | {ratio:.2f} | {of_fixed} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--tasks", default=50_000, show_default=True, help="Tasks due together per run.")
@click.option("--shapes", default="14x4,10x8,7x16", show_default=True,
              help="LEVELSxRADIX, comma-separated; 'fixed' adds the fixed-delay backend, 'buckets' (or 'buckets-sN', N "
                   "queues per due second) the due-time buckets; LEVELSxRADIX-noexit "
                   "the same ladder without its exit hop (the destination queue bound to the delivery exchange).")
@click.option("--prefetch", default="32,512", show_default=True,
              help="dead_letter_worker_consumer_prefetch values, comma-separated (one node each).")
@click.option("--only", type=click.Choice(["host", "rmq4"]), default=None, help="One broker line only.")
@click.option("--due", "due_s", default=50.0, show_default=True, help="Seconds from publishing start to the first due time.")
@click.option("--spread", "spread_s", default=1.0, show_default=True, help="Seconds the due times are spread over.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
@click.option("--name", default="shapes", show_default=True, help="Result files: NAME.md and NAME.json.")
@click.option("--fixed-queues", default=FIXED_QUEUES, show_default=True,
              help="delayq_fixed_queues of the 'fixed' rows (distinct delays a publisher may give their own queue).")
def main(tasks: int, shapes: str, prefetch: str, only: str | None, due_s: float, spread_s: float, out: Path,
         name: str, fixed_queues: int) -> None:
    """Run shapes x prefetch on each broker line and write shapes.md / shapes.json under --out."""
    shape_list = shapes.split(",")
    rows: list[dict[str, Any]] = []
    for flavour in usable_flavours(only, say=lambda text: click.echo(text, err=True)):
        for i, dl_prefetch in enumerate(int(p) for p in prefetch.split(",")):
            advanced = "" if dl_prefetch == 32 else f"{{dead_letter_worker_consumer_prefetch, {dl_prefetch}}}"
            with Cluster.start(flavour, size=1, base_port=_BASE_PORT[flavour] + 2 * i, prefix=f"dqsh{flavour[0]}{i}",
                               rabbit_advanced=advanced) as cluster:
                for shape in shape_list:
                    click.echo(f"[{time.strftime('%H:%M:%S')}] {flavour} prefetch={dl_prefetch} {shape} ...", err=True)
                    if shape == FIXED:
                        costs = fixed_costs()
                        settings = f", delayq_backend='fixed', delayq_fixed_queues={fixed_queues}"
                        hook = None
                    elif shape == DEFAULT:  # nothing set: what a user who changes nothing gets
                        costs = bucket_costs(shape)
                        settings = ""
                        hook = None
                    elif shape.startswith(BUCKETS):
                        costs = bucket_costs(shape)
                        settings = ", delayq_backend='buckets'" + bucket_settings(shape)
                        hook = None
                    else:
                        levels, radix = (int(x) for x in shape.removesuffix(NO_EXIT).split("x"))
                        costs = {**shape_costs(levels, radix), "shape": shape}
                        settings = f", delayq_backend='ladder', delayq_levels={levels}, delayq_radix={radix}"
                        hook = None
                        if shape.endswith(NO_EXIT):  # one queue fewer for every task
                            for k in ("hops_1_5s", "hops_1_60s", "hops_1_300s"):
                                costs[k] = round(costs[k] - 1, 2)
                            hook = skip_exit_hop(cluster.nodes[0], levels, radix)
                    result = run_saturation(cluster, shards=1, tasks=tasks, procs=2, due_s=due_s,
                                            workdir=Path(tempfile.mkdtemp()), extra=settings, spread_s=spread_s,
                                            before_due=hook)
                    row = {**costs, **asdict(result), "dl_prefetch": dl_prefetch}
                    row["broker_cpu_us_per_task"] = cpu_per_task(row)
                    click.echo(f"    {row}", err=True)
                    rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d")
    argv = (f"python -m benchmarks.faults.shapes --tasks {tasks} --shapes {shapes} --prefetch {prefetch} "
            f"--due {due_s:g} --spread {spread_s:g}" + (f" --fixed-queues {fixed_queues}" if FIXED in shape_list else ""))
    text = markdown(rows, tasks=tasks, when=when, argv=argv, due_s=due_s, spread_s=spread_s)
    (out / f"{name}.json").write_text(json.dumps({"when": when, "tasks": tasks, "due_s": due_s, "spread_s": spread_s,
                                                  "rows": rows}, indent=2) + "\n")
    (out / f"{name}.md").write_text(text)
    click.echo(text)


if __name__ == "__main__":
    main()
