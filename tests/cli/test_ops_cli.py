"""`celery -A APP delayq topology|status|export` against the real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import amqp
import kombu
import pytest

from celery_delayq.config import DelayqConfig
from celery_delayq.ladder import LadderSpec
from celery_delayq.publisher import LadderPublisher
from celery_delayq.topology import Topology
from helpers import drain

APP = textwrap.dedent('''
    import os
    from celery import Celery
    app = Celery("cliapp", broker=os.environ["CLI_BROKER"])
    app.conf.update(delayq_prefix=os.environ["CLI_PREFIX"], delayq_levels=int(os.environ.get("CLI_LEVELS", "8")),
                    delayq_declare=os.environ.get("CLI_DECLARE", "1") == "1", broker_heartbeat=0)
''')


@pytest.fixture
def cli(tmp_path: Path, broker_url: str, uid: str):
    (tmp_path / "cliapp.py").write_text(APP)
    env = dict(os.environ, CLI_BROKER=broker_url, CLI_PREFIX=f"cli{uid}",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def run(*args: str, ok: bool = True, **extra_env: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "celery", "-A", "cliapp", "delayq", *args],
                             env={**env, **extra_env}, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        if ok:
            assert out.returncode == 0, out.stderr[-2000:]
        return out

    yield run
    run("topology", "delete", "--force", ok=False)


def test_declare_verify_status_delete(cli, amqp_conn: amqp.Connection, uid: str) -> None:
    missing = cli("topology", "verify", ok=False)
    spec = LadderSpec(prefix=f"cli{uid}", levels=8)
    assert missing.returncode != 0 and spec.level_exchange(7) in (missing.stderr + missing.stdout)
    assert "declared" in cli("topology", "declare").stdout
    assert "complete" in cli("topology", "verify").stdout
    status = cli("status").stdout
    assert spec.level_queue(7, 3) in status and spec.level_queue(0, 1) in status
    assert "deleted" in cli("topology", "delete").stdout
    assert cli("topology", "verify", ok=False).returncode != 0


def test_delete_removes_the_exit_queues_it_is_told_about(cli, amqp_conn: amqp.Connection, uid: str) -> None:
    dest = f"exitdel.{uid}"
    amqp_conn.channel().queue_declare(dest, durable=True, auto_delete=False)
    exit_queue = Topology(LadderSpec(prefix=f"cli{uid}", levels=8), "quorum").destination("", dest).exit_queue
    try:
        cli("topology", "declare", "--destination", dest)
        assert amqp_conn.channel().queue_declare(exit_queue, passive=True).message_count == 0
        out = cli("topology", "delete", "--destination", dest).stdout
        assert "1 of them exit queues" in out
        with pytest.raises(amqp.NotFound):
            amqp_conn.channel().queue_declare(exit_queue, passive=True)
    finally:
        amqp_conn.channel().queue_delete(dest)
