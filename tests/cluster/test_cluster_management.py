"""The management API of another node than the AMQP connection's is used; another broker's is not.

The normal shape of a cluster: AMQP through one address (a load balancer, a DNS
name, a failover list), the management URL naming one host. On 3.10 and 4.3
each node of a cluster never named with ``set_cluster_name`` reports its own
``cluster_name``, so comparing names alone dropped the API (issue #27). The
publisher here is a process of its own, AMQP to node 1, API of node 2.
"""

from __future__ import annotations

import json
import logging
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
from kombu import Connection

from benchmarks.faults.nodes import Cluster
from celery_delayq.rabbitmq import management
from celery_delayq.rabbitmq.management import ManagementAPI
from celery_delayq.rabbitmq.recovery import Recovery

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
#: The shared 3.10 broker's API: a truly different broker from any private cluster.
OTHER_BROKER_API = "http://127.0.0.1:15672"


def _app(tmp_path: Path, cluster: Cluster, prefix: str, mgmt_url: str) -> Path:
    (tmp_path / "mgapp.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        import celery_delayq  # noqa: F401
        app = Celery("mgapp", broker={cluster.nodes[0].url!r})
        app.conf.update(delayq_enabled=True, delayq_prefix={prefix!r}, delayq_management_url={mgmt_url!r},
                        delayq_leader_placement="spread", task_default_queue={prefix + "-dest"!r})

        @app.task(name="mgapp.noop")
        def noop(i):
            return i
    """))
    return tmp_path


def _run(app_dir: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{app_dir}:{REPO}")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180,
                          cwd=app_dir)


_PUBLISH = ("import logging\nlogging.basicConfig(level=logging.INFO)\nimport mgapp\n"
            "mgapp.noop.apply_async((1,), countdown=3600)\n")


def _leaders(node_api: str, prefix: str) -> dict[str, int]:
    req = urllib.request.Request(f"{node_api}/api/queues/%2F?columns=name,type,leader,node")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    rows: list[dict[str, Any]] = json.load(urllib.request.urlopen(req, timeout=10))
    counts: dict[str, int] = {}
    for row in rows:
        if str(row["name"]).startswith(f"{prefix}.") and ".L" in str(row["name"]) and row.get("type") == "quorum":
            leader = str(row.get("leader") or row.get("node"))
            counts[leader] = counts.get(leader, 0) + 1
    return counts


def _delete_ladder(app_dir: Path) -> None:
    code = ("import mgapp\nwith mgapp.app.connection_for_write() as c:\n"
            "    c.default_channel.queue_delete(mgapp.app.conf.task_default_queue)\n")
    assert _run(app_dir, code).returncode == 0
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "mgapp", "delayq", "topology", "delete",
                          "--discard-messages", "--yes"], env=dict(os.environ, PYTHONPATH=f"{app_dir}:{REPO}"),
                         capture_output=True, text=True, timeout=120, cwd=app_dir)
    assert out.returncode == 0, out.stderr


def test_the_api_of_another_node_places_leaders_and_sees_held_messages(cluster: Cluster, tmp_path: Path) -> None:
    prefix = f"mg{uuid.uuid4().hex[:6]}"
    app_dir = _app(tmp_path, cluster, prefix, cluster.nodes[1].mgmt_url)
    try:
        out = _run(app_dir, _PUBLISH)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "not using the management API" not in out.stderr
        counts = _leaders(cluster.nodes[1].mgmt_url, prefix)
        # Placement needs the API: without it every leader sits on node 1 (client-local).
        assert sorted(counts) == sorted(n.nodename for n in cluster.nodes), counts
        assert max(counts.values()) - min(counts.values()) <= 1, counts
        # Held detection through node 2's API: an exit-like queue whose dead-letter exchange is missing.
        held_q = f"{prefix}.exit.gone.0"
        conn = amqp.Connection(f"127.0.0.1:{cluster.nodes[0].amqp_port}")
        conn.connect()
        try:
            ch = conn.channel()
            ch.queue_declare(held_q, durable=True, auto_delete=False, arguments={
                "x-queue-type": "quorum", "x-dead-letter-exchange": f"{prefix}.missing",
                "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish", "x-message-ttl": 1})
            for i in range(3):
                ch.basic_publish(amqp.Message(str(i)), "", held_q)
            with Connection(cluster.nodes[0].url) as kconn:
                kconn.connect()
                api = ManagementAPI.for_broker(kconn, kconn.connection, cluster.nodes[1].mgmt_url)
                assert api is not None and api.identity().state == "ok", api and api.identity()
                deadline, stuck = time.time() + 30, None
                while time.time() < deadline and not stuck:  # statistics refresh every 5 s
                    stuck = Recovery(api, prefix).stuck(held_for=0.5)
                    time.sleep(1)
                assert stuck == {held_q: 3}
        finally:
            conn.channel().queue_delete(held_q)
            conn.close()
    finally:
        _delete_ladder(app_dir)


def test_another_brokers_api_is_refused_with_one_warning_and_the_doctor_says_so(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Connection(cluster.nodes[0].url) as kconn:
        kconn.connect()
        api = ManagementAPI.for_broker(kconn, kconn.connection, OTHER_BROKER_API)
        assert api is not None
        management._reported.clear()
        with caplog.at_level(logging.INFO, logger="celery_delayq.rabbitmq.management"):
            assert api.same_broker is False and api.queues() is None and api.same_broker is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "delayq_management_url" in warnings[0], warnings
    prefix = f"mgo{uuid.uuid4().hex[:6]}"
    app_dir = _app(tmp_path, cluster, prefix, OTHER_BROKER_API)
    env = dict(os.environ, PYTHONPATH=f"{app_dir}:{REPO}")
    try:
        out = _run(app_dir, _PUBLISH)
        if cluster.nodes[0].flavour.name == "host":
            # RabbitMQ 3.x: without an API of its own the ladder's file-handle budget cannot be checked, so a
            # publish never creates the ladder implicitly; the refusal names the true cause and the way out.
            assert out.returncode != 0 and "FileHandleBudgetUnknown" in out.stderr, out.stderr[-2000:]
            assert "answers for cluster" in out.stderr and "delayq_management_url" in out.stderr, out.stderr[-3000:]
            assert "did not answer" not in out.stderr, out.stderr[-3000:]
            declare = subprocess.run([sys.executable, "-m", "celery", "-A", "mgapp", "delayq", "topology", "declare"],
                                     env=env, capture_output=True, text=True, timeout=180, cwd=app_dir)
            assert declare.returncode == 0, declare.stdout[-2000:] + declare.stderr[-2000:]
            out = _run(app_dir, _PUBLISH)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stderr.count("not using the management API at http://127.0.0.1:15672") == 1, out.stderr[-3000:]
        assert list(_leaders(cluster.nodes[0].mgmt_url, prefix)) == [cluster.nodes[0].nodename]  # no placement
        doctor = subprocess.run([sys.executable, "-m", "celery", "-A", "mgapp", "delayq", "doctor", "--json"],
                                env=env, capture_output=True, text=True, timeout=180, cwd=app_dir)
        assert "other_broker" in doctor.stdout and "delayq_management_url" in doctor.stdout, doctor.stdout[-3000:]
    finally:
        # topology delete lists the broker through its API, and another broker's is refused: clean up through
        # the node's own (the refusal itself is tests/cli/test_topology_delete.py's)
        _app(tmp_path, cluster, prefix, cluster.nodes[0].mgmt_url)
        _delete_ladder(app_dir)
