"""``delayq topology delete`` leaves nothing of the prefix behind, from the broker's own listing, and
nothing of anyone else's; bad input to ``topology`` commands is one line and changes nothing (real broker)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import amqp
import pytest

from celery_delayq.ladder.spec import LadderSpec
from cli_helpers import broker_names, run_delayq
from helpers import BROKER_HOST, management_url

pytestmark = pytest.mark.timeout(240)

_APP = textwrap.dedent('''
    import os
    from celery import Celery
    app = Celery("tdapp", broker=os.environ["TD_BROKER"])
    app.conf.update(delayq_prefix=os.environ["TD_PREFIX"], delayq_levels=3, delayq_unit_ms=1000, broker_heartbeat=0,
                    delayq_management_url=os.environ["TD_MGMT"], task_default_queue=os.environ["TD_QUEUE"])
''')
_TOKEN = "0123456789abcdef"


def _purge(vhost: str, start: str) -> None:
    """Delete every queue and exchange of the vhost whose name starts with ``start`` (this test's own)."""
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        for entry in sorted(broker_names(vhost)):
            kind, _, name = entry.partition(" ")
            if name.startswith(start):
                with contextlib.suppress(Exception):
                    ch = conn.channel()
                    ch.queue_delete(name) if kind == "queue" else ch.exchange_delete(name)
                    ch.close()
    finally:
        conn.close()


@pytest.fixture
def own_names(vhost: str, uid: str) -> Iterator[str]:
    """A prefix of this test's own; everything starting with ``td<uid>`` is deleted after, even on failure
    (quorum queues left on RabbitMQ 3.10 keep reserving file handles)."""
    yield f"td{uid}"
    _purge(vhost, f"td{uid}")


@pytest.fixture
def real_cli(tmp_path: Path, broker_url: str, own_names: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``celery -A tdapp delayq ARGS`` in a process of its own; the app knows only its default queue."""
    (tmp_path / "tdapp.py").write_text(_APP)
    env = dict(os.environ, TD_BROKER=broker_url, TD_PREFIX=own_names, TD_MGMT=management_url(),
               TD_QUEUE=f"{own_names}-q", PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def run(*args: str, ok: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "celery", "-A", "tdapp", "delayq", *args], env={**env, **extra},
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        if ok:
            assert out.returncode == 0, out.stderr[-2000:]
        assert "Traceback" not in out.stderr
        return out

    return run


def _of(names: set[str], prefix: str) -> set[str]:
    return {entry for entry in names if entry.partition(" ")[2].startswith(prefix)}


def test_delete_leaves_nothing_of_the_prefix_and_nothing_of_anyone_else(
        make_app: Callable[..., Any], real_cli: Callable[..., Any], amqp_conn: amqp.Connection, vhost: str,
        own_names: str) -> None:
    p = own_names
    settings = dict(delayq_enabled=True, delayq_prefix=p, delayq_levels=3, delayq_unit_ms=1000,
                    delayq_management_url=management_url(), task_default_queue=f"{p}-q")
    ch = amqp_conn.channel()
    for queue in (f"{p}-q", f"{p}-other", f"{p}-bound"):  # the destinations (Celery declares them in production)
        ch.queue_declare(queue, durable=True, auto_delete=False)
    ch.exchange_declare(f"{p}-x", "direct", durable=True, auto_delete=False)
    ch.queue_bind(f"{p}-bound", f"{p}-x", "rk")
    # Another app's queues and exchanges whose names start with the same characters: they must survive.
    neighbours = {f"queue {p}x.exit.default_q.{_TOKEN}", f"queue {p}x.laps", f"queue {p}.tasks",
                  f"queue {p}.exit.default_q.nothexnothexnoth", f"queue {p}.3x4.L00.extra",
                  f"exchange {p}x.unroutable", f"exchange {p}.3x4.deliverx", f"exchange {p}.events"}
    for entry in neighbours:
        kind, _, name = entry.partition(" ")
        if kind == "queue":
            ch.queue_declare(name, durable=True, auto_delete=False)
        else:
            ch.exchange_declare(name, "topic", durable=True, auto_delete=False)

    ladder = make_app(**settings)  # the ladder backend: to the default queue, queue='other', and an exchange
    ladder.send_task("proj.a", (1,), countdown=30)
    ladder.send_task("proj.b", (2,), queue=f"{p}-other", countdown=40)
    ladder.send_task("proj.c", (3,), exchange=f"{p}-x", routing_key="rk", countdown=50)
    fixed = make_app(**settings, delayq_backend="fixed")  # one TTL queue per destination and delay
    fixed.send_task("proj.d", (4,), queue=f"{p}-other", countdown=20)
    fixed.send_task("proj.e", (5,), countdown=25)
    # A second shard, as a ladder once configured with delayq_shards=2 left it (classic: cheap on 3.10).
    sharded = LadderSpec(prefix=p, levels=3, unit_ms=1000, shards=2)
    for k in range(sharded.levels):
        ch.exchange_declare(sharded.level_exchange(k, 1), "topic", durable=True, auto_delete=False)
    for queue in sharded.level_queues():
        if queue.shard == 1:
            ch.queue_declare(queue.name, durable=True, auto_delete=False)
    ch.queue_declare(f"{p}.parking", durable=True, auto_delete=False)
    ch.confirm_select()
    ch.basic_publish_confirm(amqp.Message("parked"), "", f"{p}.parking")

    listed = _of(broker_names(vhost), p)
    destinations = {e for e in listed if e.partition(" ")[2].startswith(f"{p}-")}  # Celery's: start with p too
    assert {f"queue {p}-other", f"exchange {p}-x", f"exchange {p}-other"} <= destinations
    neighbours |= destinations
    before = listed - neighbours
    exits = {e for e in before if e.startswith(f"queue {p}.exit.")}
    fixeds = {e for e in before if e.startswith(f"queue {p}.fixed.")}
    assert {e.split(".")[2] for e in exits} == {f"default_{p}-q", f"default_{p}-other", f"{p}-x_rk"}, exits
    assert len(fixeds) == 2 and any(".20000ms.default_" in e for e in fixeds), fixeds
    assert f"queue {sharded.level_queue(2, 3, 1)}" in before and f"exchange {sharded.delivery_exchange}" in before

    refused = real_cli("topology", "delete", "--yes", ok=False)  # the ladder and the exit queues hold tasks
    assert refused.returncode == 1 and "Nothing was deleted" in refused.stderr
    assert _of(broker_names(vhost), p) - neighbours == before

    out = real_cli("topology", "delete", "--discard-messages", "--yes")
    left = _of(broker_names(vhost), p)
    assert left == neighbours | {f"queue {p}.parking"}, left - neighbours  # parking only on request
    assert f"deleted ladder '{p}'" in out.stdout and "(3 of them exit queues)" in out.stdout
    assert "exit 3, fixed 2" in out.stdout and "delivery 1" in out.stdout
    assert all(e.partition(" ")[2] in out.stdout for e in exits | fixeds)  # it names each destination's queue
    assert f"kept: parking queue {p}.parking with 1 parked message(s) (add --parking" in out.stderr

    kept = real_cli("topology", "delete", "--parking", "--yes", ok=False)  # a parked message is not dropped silently
    assert kept.returncode == 1 and f"{p}.parking (1)" in kept.stderr
    gone = real_cli("topology", "delete", "--parking", "--discard-messages", "--yes")
    assert "queues: parking 1" in gone.stdout
    assert _of(broker_names(vhost), p) == neighbours  # nothing of the prefix is left, the neighbours all are


def test_without_a_listing_delete_refuses_in_one_line_and_deletes_nothing(
        real_cli: Callable[..., Any], amqp_conn: amqp.Connection, vhost: str, own_names: str) -> None:
    ch = amqp_conn.channel()
    ch.queue_declare(f"{own_names}.exit.default_q.{_TOKEN}", durable=True, auto_delete=False)
    ch.queue_declare(f"{own_names}.laps", durable=True, auto_delete=False)
    before = _of(broker_names(vhost), own_names)
    for mgmt, said in (("", "is switched off (delayq_management_url = '')"),
                       ("http://127.0.0.1:1", "at http://127.0.0.1:1 did not list them")):
        out = real_cli("topology", "delete", "--discard-messages", "--yes", ok=False, TD_MGMT=mgmt)
        lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("delayq audit:")]
        assert out.returncode == 1 and len(lines) == 1, out.stderr
        assert said in lines[0] and "nothing was deleted" in lines[0] and "rabbitmq_management" in lines[0]
        assert "delayq_management_url" in lines[0]
    assert _of(broker_names(vhost), own_names) == before


@pytest.mark.parametrize("args,said", [
    (("declare", "--destination", ""), "--destination: '' names no queue"),
    (("declare", "-d", ":"), "--destination: ':' names no queue"),
    (("declare", "-d", "  "), "names no queue"),
    (("declare", "-d", "q\x01"), "control or unprintable character"),
    (("declare", "-d", "q\udcff"), "not valid text (UTF-8)"),
    (("declare", "-d", "x" * 300), "RabbitMQ allows at most 255 bytes"),
    (("declare", "-d", "ok", "-d", ""), "names no queue"),
    (("delete", "--yes", "-d", ":"), "names no queue"),
    (("delete", "--yes", "--parking", "--keep-shared"), "give one of them"),
    (("delete", "--yes", "--bogus"), "No such option '--bogus'"),
    (("recover", "--held-for", "-1"), "'--held-for': -1.0 is not a number of seconds above 0"),
    (("recover", "--held-for", "nan"), "nan is not a number of seconds"),
    (("recover", "--held-for", "1e9"), "at most 600"),
    (("recover", "--held-for", "abc"), "'abc' is not a valid float"),
])
def test_bad_input_to_topology_commands_is_one_line_and_changes_nothing(
        make_app: Callable[..., Any], vhost: str, own_names: str, args: tuple[str, ...], said: str) -> None:
    app = make_app(delayq_prefix=own_names, delayq_levels=2, delayq_unit_ms=1000,
                   delayq_management_url=management_url())
    before = broker_names(vhost)
    out = run_delayq(app, "topology", *args, ok=False)
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("delayq audit:")]
    assert out.exit_code in (1, 2) and len(lines) == 1, out.output
    assert said in lines[0] and "Traceback" not in out.output
    assert broker_names(vhost) == before  # no ladder, no exit queue: nothing was created or deleted
