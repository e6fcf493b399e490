"""`celery -A APP delayq topology|status|export` against the real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import textwrap
from pathlib import Path

import amqp
import kombu
import pytest

from celery_delayq.config import DelayqConfig
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq.publisher import LadderPublisher
from celery_delayq.rabbitmq.topology import Topology
from celery_delayq.rabbitmq.fixed import FixedDelays
from celery_delayq.scheduling import Scheduler
from helpers import drain, management_url

APP = textwrap.dedent('''
    import os
    from celery import Celery
    app = Celery("cliapp", broker=os.environ["CLI_BROKER"])
    app.conf.update(delayq_prefix=os.environ["CLI_PREFIX"], delayq_levels=int(os.environ.get("CLI_LEVELS", "8")),
                    delayq_declare=os.environ.get("CLI_DECLARE", "1") == "1", broker_heartbeat=0)
    if os.environ.get("CLI_MGMT"):
        app.conf.delayq_management_url = os.environ["CLI_MGMT"]
''')


@pytest.fixture
def cli(tmp_path: Path, broker_url: str, uid: str):
    (tmp_path / "cliapp.py").write_text(APP)
    env = dict(os.environ, CLI_BROKER=broker_url, CLI_PREFIX=f"cli{uid}", CLI_MGMT=management_url(),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def run(*args: str, ok: bool = True, **extra_env: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "celery", "-A", "cliapp", "delayq", *args],
                             env={**env, **extra_env}, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        if ok:
            assert out.returncode == 0, out.stderr[-2000:]
        return out

    yield run
    run("topology", "delete", "--discard-messages", "--yes", ok=False)


def test_declare_verify_status_delete(cli, amqp_conn: amqp.Connection, uid: str) -> None:
    missing = cli("topology", "verify", ok=False)
    spec = LadderSpec(prefix=f"cli{uid}", levels=8)
    assert missing.returncode == 1 and f"no ladder named 'cli{uid}'" in missing.stderr
    assert "declared ladder" in cli("topology", "declare").stdout
    assert "complete" in cli("topology", "verify").stdout
    amqp_conn.channel().queue_delete(spec.level_queue(3, 1))
    partial = cli("topology", "verify", ok=False)
    assert partial.returncode == 1 and spec.level_queue(3, 1) in partial.stderr
    assert "declared" in cli("topology", "declare").stdout
    for name in spec.entry_exchanges():  # a ladder as 1.0.0rc1 declared it: no entry exchanges
        amqp_conn.channel().exchange_delete(name)
    older = cli("topology", "verify")
    assert "complete" in older.stdout and "have no entry exchanges" in older.stderr
    assert "topology declare` adds them" in older.stderr
    cli("topology", "declare")
    assert "entry" not in cli("topology", "verify").stderr
    status = " ".join(cli("status").stdout.split())
    assert "radix 4, 8 levels, unit 10 ms, one pass 11 min (longer delays lap)" in status and "L07" in status and "L00" in status
    assert json.loads(cli("status", "--json").stdout)["complete"] is True
    assert "deleted" in cli("topology", "delete", "--yes").stdout
    assert cli("topology", "verify", ok=False).returncode != 0


def test_delete_removes_the_exit_queues_it_is_told_about(cli, amqp_conn: amqp.Connection, uid: str) -> None:
    dest = f"exitdel.{uid}"
    amqp_conn.channel().queue_declare(dest, durable=True, auto_delete=False)
    exit_queue = Topology(LadderSpec(prefix=f"cli{uid}", levels=8), "quorum").destination("", dest).exit_queue
    try:
        cli("topology", "declare", "--destination", dest)
        assert amqp_conn.channel().queue_declare(exit_queue, passive=True).message_count == 0
        out = cli("topology", "delete", "--destination", dest, "--yes").stdout
        assert "1 of them exit queues" in out
        with pytest.raises(amqp.NotFound):
            amqp_conn.channel().queue_declare(exit_queue, passive=True)
    finally:
        amqp_conn.channel().queue_delete(dest)


def test_delete_finds_and_removes_the_fixed_backends_queues(cli, amqp_conn: amqp.Connection, uid: str,
                                                           broker_url: str) -> None:
    dest = f"fixeddel.{uid}"
    amqp_conn.channel().queue_declare(dest, durable=True, auto_delete=False)
    config = DelayqConfig(prefix=f"cli{uid}", levels=8, management_url=management_url())
    publisher = LadderPublisher(kombu.Connection(broker_url), config)
    fixed = FixedDelays(publisher)
    try:
        Scheduler(config, fixed).schedule(b"x", due=time.time() + 60, delay=60, exchange="", routing_key=dest,
                                          headers={})
        [queue] = fixed.queues.values()
        assert queue.startswith(f"cli{uid}.fixed.60000ms.")
        out = cli("topology", "delete", "--destination", dest, "--yes", "--discard-messages",
                  CLI_MGMT=management_url()).stdout
        assert "deleted" in out
        with pytest.raises(amqp.NotFound):
            amqp_conn.channel().queue_declare(queue, passive=True)
    finally:
        publisher.close()
        amqp_conn.channel().queue_delete(dest)


@pytest.mark.parametrize("args", [
    ("status",), ("status", "--json"), ("topology", "verify"), ("topology", "declare"),
    ("topology", "delete", "--yes"), ("parking", "list", "--json"), ("parking", "inspect", "abc"),
    ("parking", "replay", "--all", "--yes", "--expect", "1"), ("parking", "purge", "--all", "--yes", "--expect", "1"),
    ("pending",), ("pending", "--json"),
    ("cancel", "abc"), ("doctor",), ("doctor", "--json"), ("topology", "recover"),
])
def test_a_stopped_broker_is_one_line_naming_the_url(cli, args: tuple[str, ...]) -> None:
    out = cli(*args, ok=False, CLI_BROKER="amqp://guest:s3cret@127.0.0.1:1//")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "amqp://guest:**@127.0.0.1:1//" in lines[0] and "Connection refused" in lines[0]
    assert "s3cret" not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_a_refused_login_is_one_line(cli, broker_url: str) -> None:
    out = cli("status", ok=False, CLI_BROKER=broker_url.replace("guest:guest@", "guest:wrong@"))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "ACCESS_REFUSED" in out.stderr and "guest:**@" in out.stderr and "wrong" not in out.stderr
