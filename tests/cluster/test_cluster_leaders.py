"""Balanced leaders on a real 3-node cluster: a new ladder's quorum queues lead on every node.

The publisher is a separate process that only imports the app (no install(),
no worker), as a web process would; it talks to node 1 only.
"""

from __future__ import annotations

import json
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
    assert "leaders over 1 of 3 nodes" in status.stdout, status.stdout


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
