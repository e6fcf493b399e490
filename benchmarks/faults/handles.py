"""What each kind of broker object costs in file handles on RabbitMQ 3.x (and 4.x, to compare).

    python -m benchmarks.faults.handles               # both lines, private single nodes at ulimit -n 1024
    python -m benchmarks.faults.handles --only host   # RabbitMQ 3.10 only
    python -m benchmarks.faults.handles --cluster     # a ladder's reservations per node, 3-node 3.10 cluster

On a private single node started at Debian's default open-files limit (1024),
``--count`` objects of each kind are declared in turn, and after each batch
three numbers are read:

- ``reserved``: the node's ``file_handle_cache`` count (``rabbitmqctl eval
  'file_handle_cache:info().'``, ``total_used``), which includes the handles a
  quorum queue replica *reserves*; past ``total_limit`` the node stops
  accepting connections (3.x only: 4.x has no file-handle cache);
- ``fd_used``: ``GET /api/nodes``'s ``fd_used``;
- ``open_fds``: the VM's real open descriptors (``/proc/PID/fd``), which the
  kernel's limit applies to whatever the cache counts.

Then one whole default ladder (levels, unroutable, laps, index streams, cancel
log) and one exit queue are declared through :class:`celery_delayq.rabbitmq.topology.Topology`,
and measured the same way. Never touches the shared brokers. Results go to
``benchmarks/results/handles.json``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable

import amqp
import click

from .nodes import Cluster, Node, usable_flavours

RESULTS = Path(__file__).resolve().parents[1] / "results"
_PORTS = {"host": 5688, "rmq4": 5689}


def _api(node: Node, path: str) -> Any:
    req = urllib.request.Request(node.mgmt_url + path)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def sample(node: Node) -> dict[str, int | None]:
    """``reserved`` (file_handle_cache, 3.x), ``limit``, ``fd_used`` (API) and ``open_fds`` (/proc) of a node."""
    out: dict[str, int | None] = {"reserved": None, "limit": None}
    done = node.ctl("eval", "file_handle_cache:info().", check=False, timeout=30)
    for key, name in (("total_used", "reserved"), ("total_limit", "limit")):
        m = re.search(rf"{{{key},(\d+)}}", done.stdout.replace(" ", "").replace("\n", ""))
        if m:
            out[name] = int(m.group(1))
    row = _api(node, "/api/nodes?columns=name,fd_used,fd_total")[0]
    out["fd_used"] = int(row.get("fd_used") or 0)
    pids = node.beam_pids()
    out["open_fds"] = len(os.listdir(f"/proc/{pids[0]}/fd")) if pids else None
    return out


def _delta(after: dict[str, int | None], before: dict[str, int | None], n: int) -> dict[str, float | None]:
    return {k: (round((after[k] - before[k]) / n, 2) if after[k] is not None and before[k] is not None else None)
            for k in ("reserved", "fd_used", "open_fds")}


def _settle(node: Node) -> dict[str, int | None]:
    time.sleep(3)  # new queues' processes open their files (WAL, segments) asynchronously
    return sample(node)


def measure(node: Node, count: int) -> dict[str, Any]:
    """Handles per object of each kind, and of one default ladder."""
    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.ladder.index_layout import IndexLayout
    from celery_delayq.rabbitmq.topology import Topology

    conn = amqp.Connection(f"127.0.0.1:{node.amqp_port}")
    conn.connect()
    ch = conn.channel()
    tag = uuid.uuid4().hex[:6]
    kinds: dict[str, Callable[[str], None]] = {
        "quorum queue": lambda n: ch.queue_declare(n, durable=True, auto_delete=False,
                                                   arguments={"x-queue-type": "quorum"}),
        "stream": lambda n: ch.queue_declare(n, durable=True, auto_delete=False,
                                             arguments={"x-queue-type": "stream"}),
        "classic queue (durable)": lambda n: ch.queue_declare(n, durable=True, auto_delete=False),
        "topic exchange": lambda n: ch.exchange_declare(n, "topic", durable=True, auto_delete=False),
    }
    result: dict[str, Any] = {"baseline": _settle(node), "per_object": {}, "count": count}
    for kind, declare in kinds.items():
        before = sample(node)
        names = [f"h{tag}.{kind.split()[0]}.{i}" for i in range(count)]
        for name in names:
            declare(name)
        after = _settle(node)
        result["per_object"][kind] = _delta(after, before, count)
        for name in names:
            ch.exchange_delete(name) if kind == "topic exchange" else ch.queue_delete(name)
    time.sleep(3)
    spec = LadderSpec(prefix=f"h{tag}")
    topo = Topology(spec, "quorum", index=IndexLayout(spec))
    before = _settle(node)
    topo.declare(conn)
    after_ladder = _settle(node)
    ch.queue_declare(f"h{tag}-dest", durable=True, auto_delete=False)
    dest = topo.destination("", f"h{tag}-dest")
    topo.ensure_exit(conn, dest, declare=True)
    after_exit = _settle(node)
    kinds_count = {"quorum": 0, "stream": 0, "classic": 0, "exchange": 0}
    for kind, _name, args in topo.entities():
        key = "exchange" if kind.startswith("exchange") else str(args.get("x-queue-type", "classic"))
        kinds_count[key] += 1
    result["ladder"] = {"objects": kinds_count, "cost": _delta(after_ladder, before, 1),
                        "exit_queue": _delta(after_exit, after_ladder, 1)}
    topo.delete(conn, if_empty=False, exit_queues=[dest.exit_queue])
    ch.queue_delete(f"h{tag}-dest")
    result["after_delete"] = _settle(node)
    conn.close()
    return result


def measure_cluster(cluster: Cluster) -> dict[str, Any]:
    """Reservations per node of one default ladder on a 3-node cluster: all leaders on the declaring node, then spread."""
    import kombu

    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.rabbitmq.management import ManagementAPI
    from celery_delayq.ladder.index_layout import IndexLayout
    from celery_delayq.rabbitmq.placement import LeaderPlacement
    from celery_delayq.rabbitmq.topology import Topology

    first = cluster.nodes[0]
    conn = amqp.Connection(f"127.0.0.1:{first.amqp_port}")
    conn.connect()
    template = kombu.Connection(first.url)
    api = ManagementAPI.for_connection(template, first.mgmt_url)
    out: dict[str, Any] = {}
    for how in ("client-local", "spread"):
        spec = LadderSpec(prefix=f"hc{uuid.uuid4().hex[:6]}")
        topo = Topology(spec, "quorum", index=IndexLayout(spec))
        if how == "spread":
            topo.placement = LeaderPlacement(api, template).place
        before = {n.nodename: sample(n)["reserved"] for n in cluster.nodes}
        topo.declare(conn)
        time.sleep(3)
        after = {n.nodename: sample(n)["reserved"] for n in cluster.nodes}
        out[how] = {node: (after[node] or 0) - (before[node] or 0) for node in after}
        topo.delete(conn, if_empty=False)
        time.sleep(3)
    conn.close()
    return out


@click.command()
@click.option("--only", type=click.Choice(["host", "rmq4"]), default=None)
@click.option("--count", default=20, show_default=True, help="Objects of each kind per measurement.")
@click.option("--nofile", default=1024, show_default=True, help="The node's open-files limit (ulimit -n).")
@click.option("--cluster", is_flag=True, help="Instead: one ladder's reservations per node of a 3-node 3.10 cluster.")
def main(only: str | None, count: int, nofile: int, cluster: bool) -> None:
    """Measure file handles per broker object on private single nodes; write results/handles.json."""
    out: dict[str, Any] = {}
    if cluster:
        with Cluster.start("host", size=3, base_port=5688, prefix="dqhc", nofile=nofile) as started:
            found = measure_cluster(started)
        click.echo(json.dumps(found, indent=1))
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "handles_cluster.json").write_text(json.dumps({"3.10 3-node": found}, indent=1) + "\n")
        return
    for flavour in usable_flavours(only):
        with Cluster.start(flavour, size=1, base_port=_PORTS[flavour], prefix=f"dqh{flavour[0]}",
                           nofile=nofile) as cluster:
            node = cluster.nodes[0]
            version = _api(node, "/api/overview?columns=rabbitmq_version")["rabbitmq_version"]
            out[version] = measure(node, count)
            out[version]["nofile"] = nofile
            click.echo(json.dumps({version: out[version]}, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "handles.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
