"""Balanced leaders on a real 3-node cluster: a new ladder's quorum queues lead on every node.

The publisher is a separate process that only imports the app (no install(),
no worker), as a web process would; it talks to node 1 only.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import amqp

import pytest

from benchmarks.faults.nodes import Cluster

#: Includes a private cluster's start-up (60-70 s) for the first test that asks for it.
pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]


def _app_module(tmp_path: Path, cluster: Cluster, prefix: str, placement: str) -> Path:
    node = cluster.nodes[0]
    (tmp_path / "clapp.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        import celery_delayq  # noqa: F401 - the ladder turns on where the package is imported
        app = Celery("clapp", broker={node.url!r})
        app.conf.update(delayq_enabled=True, delayq_prefix={prefix!r},
                        delayq_management_url={node.mgmt_url!r}, delayq_leader_placement={placement!r},
                        task_default_queue={prefix + "-dest"!r})

        @app.task(name="clapp.noop")
        def noop(i):
            return i
    """))
    return tmp_path


def _publish(app_dir: Path, countdown: float, n: int = 1) -> None:
    code = ("from kombu import Queue\nimport clapp\n"
            "with clapp.app.connection_for_write() as c:\n"
            "    Queue(clapp.app.conf.task_default_queue, channel=c.default_channel, durable=True).declare()\n"
            f"for i in range({n}):\n    clapp.noop.apply_async((i,), countdown={countdown})\n")
    env = dict(os.environ, PYTHONPATH=f"{app_dir}:{REPO}")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120, cwd=app_dir)


def _cli(app_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{app_dir}:{REPO}")
    return subprocess.run([sys.executable, "-m", "celery", "-A", "clapp", "delayq", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=app_dir)


def _leaders(cluster: Cluster, prefix: str) -> dict[str, int]:
    node = cluster.nodes[0]
    req = urllib.request.Request(f"{node.mgmt_url}/api/queues/%2F?columns=name,type,leader,node")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    rows: list[dict[str, Any]] = json.load(urllib.request.urlopen(req, timeout=10))
    counts: dict[str, int] = {}
    for row in rows:
        name = str(row["name"])
        if name.startswith(f"{prefix}.") and ".L" in name and row.get("type") == "quorum":
            leader = str(row.get("leader") or row.get("node"))
            counts[leader] = counts.get(leader, 0) + 1
    return counts


def test_a_new_ladder_leads_on_every_node(cluster: Cluster, tmp_path: Path) -> None:
    prefix = f"spread{uuid.uuid4().hex[:6]}"
    app_dir = _app_module(tmp_path, cluster, prefix, "spread")
    _publish(app_dir, countdown=3600)
    counts = _leaders(cluster, prefix)
    assert sorted(counts) == sorted(n.nodename for n in cluster.nodes), counts
    assert max(counts.values()) - min(counts.values()) <= 1, counts  # 14 levels x 3 digits: 14 each
    status = _cli(app_dir, "status", "--json")
    doc = json.loads(status.stdout)
    assert doc["leaders"] == counts
    assert doc["totals"]["waiting"] == 1
    verify = _cli(app_dir, "topology", "verify")
    assert verify.returncode == 0, verify.stderr
    assert "warning" not in verify.stderr


def test_client_local_placement_is_reported_with_the_command_that_spreads_it(cluster: Cluster,
                                                                               tmp_path: Path) -> None:
    prefix = f"local{uuid.uuid4().hex[:6]}"
    app_dir = _app_module(tmp_path, cluster, prefix, "broker")
    _publish(app_dir, countdown=3600)
    counts = _leaders(cluster, prefix)
    assert list(counts) == [cluster.nodes[0].nodename], counts  # the broker's default: client-local
    verify = _cli(app_dir, "topology", "verify")
    assert verify.returncode == 0
    assert "ladder queue leaders sit on" in verify.stderr and "rabbitmq-queues rebalance quorum" in verify.stderr
    status = _cli(app_dir, "status")
    assert "leaders over 1 of 3 nodes" in " ".join(status.stdout.split()), status.stdout


def test_a_spread_ladder_delivers_on_time_through_every_node(cluster: Cluster, tmp_path: Path) -> None:
    prefix = f"deliver{uuid.uuid4().hex[:6]}"
    app_dir = _app_module(tmp_path, cluster, prefix, "spread")
    sent = time.time()
    _publish(app_dir, countdown=2.0, n=50)  # each digit path crosses queues led by different nodes
    published = time.time()  # every task is due by published + 2 s
    conn = amqp.Connection(f"127.0.0.1:{cluster.nodes[1].amqp_port}")  # read through another node
    conn.connect()
    try:
        ch = conn.channel()
        got: list[float] = []
        deadline = time.time() + 60
        while len(got) < 50 and time.time() < deadline:
            msg = ch.basic_get(f"{prefix}-dest", no_ack=True)
            if msg is None:
                time.sleep(0.05)
                continue
            got.append(time.time())
    finally:
        conn.close()
    assert len(got) == 50
    assert min(got) >= sent + 2.0  # never early (the publish itself started after `sent`)
    # On time: a new ladder's queues must find their dead-letter exchanges from the start (a worker
    # that starts without one holds what expires for 180 s on 3.10).
    assert max(got) <= published + 2.0 + 3.0, f"last arrived {max(got) - published - 2.0:.1f} s after its due time"


def _owned_by_kind(cluster: Cluster, prefix: str) -> dict[str, dict[str, int]]:
    """Leaders per node of every queue of ``prefix``'s ladder, by kind, as the API of node 1 shows them."""
    node = cluster.nodes[0]
    req = urllib.request.Request(f"{node.mgmt_url}/api/queues/%2F?columns=name,type,leader,node")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    rows: list[dict[str, Any]] = json.load(urllib.request.urlopen(req, timeout=10))
    patterns = {"levels": rf"^{prefix}\.14x4\.L\d\d\.d\w$", "index": rf"^{prefix}\.14x4\.index\.[0-9a-f]{{2}}$",
                "cancels": rf"^{prefix}\.14x4\.cancels$", "unroutable": rf"^{prefix}\.unroutable$",
                "laps": rf"^{prefix}\.laps$", "parking": rf"^{prefix}\.parking$", "exits": rf"^{prefix}\.exit\."}
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        for kind, pattern in patterns.items():
            if re.match(pattern, str(row["name"])):
                leader = str(row.get("leader") or row.get("node"))
                out.setdefault(kind, {})[leader] = out.setdefault(kind, {}).get(leader, 0) + 1
    return out


def test_every_queue_a_new_ladder_owns_is_spread_and_status_shows_it(cluster: Cluster, tmp_path: Path) -> None:
    from kombu import Connection

    from celery_delayq.parking import Parker

    prefix = f"owned{uuid.uuid4().hex[:6]}"
    app_dir = _app_module(tmp_path, cluster, prefix, "spread")
    _publish(app_dir, countdown=3600)  # through node 1 only
    nodes = sorted(n.nodename for n in cluster.nodes)
    seen = _owned_by_kind(cluster, prefix)
    assert {"levels", "index", "cancels", "unroutable", "laps", "exits"} <= set(seen), seen
    for kind in ("levels", "index"):  # 42 and 16 queues: on every node, counts within one
        assert sorted(seen[kind]) == nodes, (kind, seen)
        assert max(seen[kind].values()) - min(seen[kind].values()) <= 1, (kind, seen)
    own = ("levels", "unroutable", "laps", "index", "cancels")
    per_node = {n: sum(seen[kind].get(n, 0) for kind in own) for n in nodes}
    assert max(per_node.values()) - min(per_node.values()) <= 1, per_node  # 61 queues: 21/20/20, not 33 on one
    singles = {next(iter(seen[kind])) for kind in ("unroutable", "laps", "cancels")}
    assert len(singles) >= 2, seen  # the one-queue kinds do not all pile onto one node either

    # The parking queue, made at the first park, goes to a node that leads the fewest queues.
    req = urllib.request.Request(f"{cluster.nodes[0].mgmt_url}/api/queues/%2F?columns=name,leader,node")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    load = {n: 0 for n in nodes}
    for row in json.load(urllib.request.urlopen(req, timeout=10)):
        load[str(row.get("leader") or row.get("node"))] += 1
    parker = Parker(Connection(cluster.nodes[0].url), queue_type="quorum", management_url=cluster.nodes[0].mgmt_url,
                    spread=True)
    try:
        parker.park(f"{prefix}.parking", amqp.Message(b"{}", application_headers={"id": "t1"}))
    finally:
        parker.close()
    parked_on = next(iter(_owned_by_kind(cluster, prefix)["parking"]))
    assert load[parked_on] == min(load.values()), (parked_on, load)

    # `status --json` shows the same spread, kind by kind, and the table shows it too.
    doc = json.loads(_cli(app_dir, "status", "--json").stdout)
    assert doc["leaders_by_kind"] == _owned_by_kind(cluster, prefix)
    table = _cli(app_dir, "status").stdout
    assert "leaders per node, by kind of queue" in table, table
    for kind in ("levels", "index", "cancels", "laps", "unroutable", "parking", "exits"):
        assert kind in table, table
