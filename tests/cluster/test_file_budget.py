"""RabbitMQ 3.10 at Debian's default ``ulimit -n`` 1024: new ladders never wedge the broker.

A private single node is started at 1024 open files, once with the management
plugin and once without. A publisher-only process (the app's settings and
``import celery_delayq``, nothing else) publishes one delayed task under each
of 12 new prefixes in turn. After every step a fresh connection must open
within 5 s; every publish either succeeds or is refused with one of the
package's errors saying why; several apps' ladders fit.

Before the budget check, seven ladders were accepted and the eighth publish
hung while the node stopped accepting connections for everyone (DESIGN-NOTES §9).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import amqp
import pytest
from cluster_helpers import why_not

from benchmarks.faults.nodes import Cluster

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
STEPS = 12


@pytest.fixture(scope="module", params=["management", "no-management"])
def node_1024(request: pytest.FixtureRequest) -> Iterator[tuple[Cluster, bool]]:
    """A private 3.10 node at ``ulimit -n`` 1024, with or without the management API."""
    why = why_not("host")
    if why:
        pytest.skip(why)
    management = request.param == "management"
    with Cluster.start("host", size=1, base_port=5688 if management else 5689, prefix="dqfb", management=management,
                       nofile=1024) as cluster:
        yield cluster, management


def _app_dir(tmp_path: Path, cluster: Cluster, management: bool, prefix: str) -> Path:
    node = cluster.nodes[0]
    # Without the plugin, the API's usual port on the broker's host answers nothing (as on a stock Debian broker).
    api = node.mgmt_url if management else f"http://127.0.0.1:{node.amqp_port + 10000}"
    where = tmp_path / prefix
    where.mkdir()
    (where / "budgetapp.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        import celery_delayq  # noqa: F401 - the ladder turns on where the package is imported
        app = Celery("budgetapp", broker={node.url!r})
        app.conf.update(delayq_enabled=True, delayq_prefix={prefix!r}, delayq_management_url={api!r},
                        task_default_queue="budget-dest", broker_heartbeat=0)

        @app.task(name="budgetapp.noop")
        def noop():
            return None
    """))
    return where


_PUBLISH = """
import json
from kombu import Queue
from celery_delayq.errors import DelayqError
import budgetapp
with budgetapp.app.connection_for_write() as c:
    Queue("budget-dest", channel=c.default_channel, durable=True).declare()
try:
    budgetapp.noop.apply_async(countdown=3600)
    print(json.dumps({"ok": True}))
except DelayqError as exc:
    print(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}))
"""


def _run(where: Path, *argv: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{where}:{REPO}")
    try:
        return subprocess.run([sys.executable, *argv], env=env, cwd=where, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv[:3])} hung for {timeout} s: the broker stopped answering")


def _publish(where: Path) -> dict[str, Any]:
    done = _run(where, "-c", _PUBLISH)
    assert done.returncode == 0, f"the publish failed outside the package's errors:\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _fresh_connection_within(cluster: Cluster, seconds: float) -> float:
    started = time.monotonic()
    conn = amqp.Connection(f"127.0.0.1:{cluster.nodes[0].amqp_port}", connect_timeout=seconds)
    try:
        conn.connect()
        conn.channel().close()
    except Exception as exc:  # noqa: BLE001 - any failure is the wedge this test is about
        pytest.fail(f"a fresh connection did not open within {seconds} s: {exc!r}")
    finally:
        conn.collect()
    took = time.monotonic() - started
    assert took < seconds, f"a fresh connection took {took:.1f} s"
    return took


def test_new_ladders_at_1024_open_files_never_wedge_the_broker(node_1024: tuple[Cluster, bool],
                                                               tmp_path: Path) -> None:
    cluster, management = node_1024
    run = uuid.uuid4().hex[:4]
    outcomes: list[dict[str, Any]] = []
    dirs = []
    for step in range(STEPS):
        where = _app_dir(tmp_path, cluster, management, f"fb{run}{step:02d}")
        dirs.append(where)
        outcomes.append(_publish(where))
        _fresh_connection_within(cluster, 5.0)
    refused = [o for o in outcomes if not o["ok"]]
    print(f"{'with' if management else 'without'} the management API: "
          + " ".join("ok" if o["ok"] else o["error"] for o in outcomes))
    for o in refused:
        assert o["error"] in ("FileHandleBudgetExceeded", "FileHandleBudgetUnknown"), o
        assert "RabbitMQ 3.10" in o["message"] and "stops accepting connections" in o["message"], o["message"]
        assert "ulimit -n 65536" in o["message"] and "delayq topology delete" in o["message"], o["message"]
        assert "delayq_prefix" in o["message"], o["message"]
    if management:
        accepted = [o for o in outcomes if o["ok"]]
        # Several apps' ladders fit (129 + 3 handles each, of ~924 less 100 kept for connections) ...
        assert len(accepted) >= 5, outcomes
        # ... in turn, until the first refusal, which names the open-files limit (1024) and the ladders there.
        assert outcomes[: len(accepted)] == accepted, outcomes
        assert refused and all(o["error"] == "FileHandleBudgetExceeded" for o in refused), outcomes
        assert "open-files limit 1024" in refused[0]["message"], refused[0]["message"]
        assert f"fb{run}00.14x4" in refused[0]["message"], refused[0]["message"]
        return
    # Without the API nothing is created implicitly: each publish is refused, saying how to go on ...
    assert not [o for o in outcomes if o["ok"]], outcomes
    for o in refused:
        assert o["error"] == "FileHandleBudgetUnknown", o
        assert "rabbitmq-plugins enable rabbitmq_management" in o["message"], o["message"]
        assert "delayq topology declare" in o["message"], o["message"]
    # ... and three apps' operators create theirs explicitly: they fit, and their publishes go through.
    for where in dirs[:3]:
        declared = _run(where, "-m", "celery", "-A", "budgetapp", "delayq", "topology", "declare")
        assert declared.returncode == 0, declared.stderr
        assert "file_handle_cache:info()" in declared.stderr, declared.stderr  # the cost, and how to check it
        assert _publish(where) == {"ok": True}
        _fresh_connection_within(cluster, 5.0)
    assert _publish(dirs[3])["error"] == "FileHandleBudgetUnknown"  # a fourth, new prefix: still refused
