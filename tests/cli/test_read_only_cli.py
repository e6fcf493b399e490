"""Reading commands create nothing; ``topology delete`` deletes (and counts) only what exists and asks first;
``status`` totals, levels and due-time bounds. Real broker, Celery's CLI context."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import amqp
import pytest

from celery_delayq.rabbitmq.status import SCHEMA
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.ladder.index_layout import index_layout
from celery_delayq.rabbitmq.topology import Topology
from cli_helpers import broker_names, run_delayq

pytestmark = pytest.mark.timeout(120)


def _spec(app: Any) -> LadderSpec:
    return LadderSpec(prefix=app.conf.delayq_prefix, levels=3, unit_ms=1000)


def _topology(spec: LadderSpec) -> Topology:
    """The whole ladder as the app declares it: with the index and cancel-log streams."""
    topo = Topology(spec, "quorum")
    topo.index = index_layout(spec, index=True, version=(3, 10))
    return topo


def test_reading_an_absent_ladder_creates_nothing(ladder_app: Any, vhost: str) -> None:
    before = broker_names(vhost)
    prefix = ladder_app.conf.delayq_prefix
    for args in (("status",), ("topology", "verify")):
        out = run_delayq(ladder_app, *args, ok=False)
        assert out.exit_code == 1
        assert f"no ladder named '{prefix}' ({prefix}.3x4) on amqp://guest:**@" in out.output
        assert "nothing was created" in out.output and len(out.output.strip().splitlines()) == 1
    as_json = run_delayq(ladder_app, "status", "--json", ok=False)
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["exists"] is False and doc["totals"] == {"waiting": 0, "parked": 0, "unroutable": 0, "held": None,
                                                     "cancelled": None}
    # level exchanges, deliver + unroutable, level queues and their entry exchanges, unroutable, laps, 16 index
    # streams + the cancel log
    assert len(doc["missing"]) == 3 + 2 + 9 + 9 + 1 + 1 + 17
    assert run_delayq(ladder_app, "parking", "list", "--json").stdout.strip() == "[]"
    assert "nothing has been parked yet" in run_delayq(ladder_app, "parking", "list").stdout
    out = run_delayq(ladder_app, "topology", "delete", "--yes")
    assert "nothing to delete" in out.stdout and "deleted" not in out.stdout
    assert broker_names(vhost) == before


def test_a_ladder_of_another_shape_is_named(ladder_app: Any, amqp_conn: amqp.Connection, private_ladder) -> None:
    other = private_ladder(prefix=ladder_app.conf.delayq_prefix, levels=2, unit_ms=1000)
    other.declare(amqp_conn)
    out = run_delayq(ladder_app, "status", ok=False)
    assert out.exit_code == 1 and "exists in another shape" in out.output and "3 levels of radix 4" in out.output
    kept = run_delayq(ladder_app, "topology", "delete", "--yes").stdout
    assert "nothing to delete" in kept and "is kept" in kept
    assert other.inspect(amqp_conn).complete  # the other shape, and the unroutable queue it shares, untouched


def test_delete_counts_only_what_existed_and_asks_first(ladder_app: Any, amqp_conn: amqp.Connection,
                                                         vhost: str) -> None:
    before = broker_names(vhost)
    spec = _spec(ladder_app)
    topo = _topology(spec)
    topo.declare(amqp_conn)
    amqp_conn.channel().queue_delete(spec.level_queue(1, 2))  # a partly deleted ladder
    refused = run_delayq(ladder_app, "topology", "delete", ok=False)
    assert refused.exit_code == 1 and "not without --yes in a non-interactive shell" in refused.output
    assert topo.inspect(amqp_conn).queue(spec.level_queue(0, 1)).exists
    out = run_delayq(ladder_app, "topology", "delete", "--yes").stdout
    assert f"deleted ladder '{spec.prefix}'" in out and "14 exchanges, 27 queues (0 of them exit queues)" in out
    assert "exchanges: levels 3, entries 9, delivery 1, unroutable 1" in out
    assert broker_names(vhost) == before
    again = run_delayq(ladder_app, "topology", "delete", "--yes").stdout
    assert "nothing to delete" in again


def test_delete_refuses_while_messages_wait_and_deletes_nothing(ladder_app: Any, amqp_conn: amqp.Connection) -> None:
    spec = _spec(ladder_app)
    topo = _topology(spec)
    topo.declare(amqp_conn)
    ch = amqp_conn.channel()
    ch.confirm_select()
    ch.basic_publish_confirm(amqp.Message("waits 32 s"), spec.level_exchange(2), "2.0.0.tok")
    out = run_delayq(ladder_app, "topology", "delete", "--yes", ok=False)
    assert out.exit_code == 1 and "Nothing was deleted" in out.output and spec.level_queue(2, 2) in out.output
    assert topo.inspect(amqp_conn).complete  # exchanges too: a busy queue keeps its dead-letter target
    assert "deleted ladder" in run_delayq(ladder_app, "topology", "delete", "--discard-messages", "--yes").stdout
    assert not topo.inspect(amqp_conn).exists


def _wait_depth(topo: Topology, conn: amqp.Connection, queue: str, n: int) -> None:
    deadline = time.time() + 10
    while topo.inspect(conn, extra_queues=[queue]).queue(queue).messages != n:
        assert time.time() < deadline, f"{queue} never held {n} messages"
        time.sleep(0.05)


def test_status_totals_levels_and_due_bounds(ladder_app: Any, amqp_conn: amqp.Connection) -> None:
    spec = _spec(ladder_app)
    topo = _topology(spec)
    topo.declare(amqp_conn)
    parking = f"{spec.prefix}.parking"
    ch = amqp_conn.channel()
    ch.queue_declare(parking, durable=True, auto_delete=False)
    ch.confirm_select()
    for _ in range(3):  # digit 2 at level 2: 2 * 16 s in that queue, then up to 15 s below
        ch.basic_publish_confirm(amqp.Message("w"), spec.level_exchange(2), "2.0.0.tok")
    for _ in range(2):
        ch.basic_publish_confirm(amqp.Message("p"), "", parking)
    ch.basic_publish_confirm(amqp.Message("u"), spec.unroutable_exchange, "")
    _wait_depth(topo, amqp_conn, spec.level_queue(2, 2), 3)
    t0 = time.time()
    doc = json.loads(run_delayq(ladder_app, "status", "--json").stdout)
    assert doc["schema"] == SCHEMA and doc["exists"] and doc["complete"] and doc["missing"] == []
    assert {k: v for k, v in doc["totals"].items() if k != "held"} == {"waiting": 3, "parked": 2, "unroutable": 1,
                                                                       "cancelled": 0}
    assert doc["totals"]["held"] in (0, None) and doc["held"] in ({}, None)  # None: no management API of this broker
    assert doc["ladder"]["max_delay"] == "1.1 min" and doc["ladder"]["namespace"] == f"{spec.prefix}.3x4"
    top = doc["levels"][0]
    assert top["level"] == 2 and top["messages"] == 3 and top["due_within_s"] == 47.0
    assert [q["messages"] for q in top["queues"]] == [0, 3, 0] and top["queues"][1]["ttl_s"] == 32.0
    assert [lv["messages"] for lv in doc["levels"][1:]] == [0, 0]
    due = time.mktime(time.strptime(doc["all_due_by"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert t0 + 47 - 2 <= due <= t0 + 47 + 2 and doc["next_due_by"] == doc["all_due_by"]
    shown = run_delayq(ladder_app, "status").stdout
    assert max(map(len, shown.splitlines())) <= 80, shown  # fits a terminal of 80 columns
    table = " ".join(shown.split())
    assert "waiting 3 · parked 2 · unroutable 1" in table
    assert "radix 4, 3 levels, unit 1 s, one pass 1.1 min (longer delays lap)" in table and "47 s" in table
    assert "16 s – 48 s" in table  # level 2's queues wait 16, 32 and 48 s


def test_status_names_missing_parts(ladder_app: Any, amqp_conn: amqp.Connection) -> None:
    spec = _spec(ladder_app)
    _topology(spec).declare(amqp_conn)
    amqp_conn.channel().queue_delete(spec.level_queue(0, 3))
    doc = json.loads(run_delayq(ladder_app, "status", "--json").stdout)
    assert doc["exists"] and not doc["complete"] and doc["missing"] == [f"queue {spec.level_queue(0, 3)}"]
    table = run_delayq(ladder_app, "status").stdout
    assert "incomplete: 1 missing" in table and "missing" in table.split("L00")[1].splitlines()[0]


_PTY_APP = textwrap.dedent('''
    import os
    from celery import Celery
    app = Celery("ptyapp", broker=os.environ["CLI_BROKER"])
    app.conf.update(delayq_prefix=os.environ["CLI_PREFIX"], delayq_levels=3, delayq_unit_ms=1000, broker_heartbeat=0,
                    delayq_management_url=os.environ["CLI_MGMT"])
''')


def test_delete_at_a_terminal_asks_and_takes_yes(ladder_app: Any, amqp_conn: amqp.Connection, broker_url: str,
                                                 tmp_path: Path) -> None:
    spec = _spec(ladder_app)
    topo = _topology(spec)
    topo.declare(amqp_conn)
    (tmp_path / "ptyapp.py").write_text(_PTY_APP)
    from helpers import management_url

    env = dict(os.environ, CLI_BROKER=broker_url, CLI_PREFIX=spec.prefix, CLI_MGMT=management_url(),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def at_terminal(answer: str) -> str:
        leader, follower = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "ptyapp", "delayq", "topology", "delete"],
                                stdin=follower, stdout=follower, stderr=follower, env=env, cwd=tmp_path)
        os.close(follower)
        seen = b""
        while b"[y/N]" not in seen:
            seen += os.read(leader, 4096)
        os.write(leader, answer.encode() + b"\n")
        proc.wait(timeout=60)
        with_rest = seen
        try:
            while chunk := os.read(leader, 4096):
                with_rest += chunk
        except OSError:
            pass
        os.close(leader)
        return with_rest.decode()

    said_no = at_terminal("n")
    assert "Delete ladder" in said_no and "Aborted" in said_no and topo.inspect(amqp_conn).complete
    said_yes = at_terminal("y")
    assert "deleted ladder" in said_yes and not topo.inspect(amqp_conn).exists


def test_status_shows_an_exit_queue_that_holds_what_its_destination_cannot_take(
        make_app: Any, amqp_conn: amqp.Connection, uid: str) -> None:
    """The destination loses its binding while a task waits: the exit queue holds it, and status says so."""
    from helpers import management_url

    app = make_app(delayq_enabled=True, delayq_management_url=management_url(), delayq_prefix=f"hd{uid}",
                   delayq_levels=3, delayq_unit_ms=100)
    exchange, queue = f"hd{uid}.x", f"hd{uid}.dest"
    ch = amqp_conn.channel()
    ch.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
    ch.queue_declare(queue, durable=True, auto_delete=False)
    ch.queue_bind(queue, exchange, "k")
    try:
        # 3 s: the first publish also creates this ladder, which on a loaded node took longer than a
        # shorter countdown, so the task reached its destination before the binding went.
        app.send_task("proj.remind", (1,), exchange=exchange, routing_key="k", countdown=3)
        ch.queue_unbind(queue, exchange, "k")
        deadline, doc = time.time() + 30, {}
        while time.time() < deadline:  # the management API's counts lag by up to 5 s
            doc = json.loads(run_delayq(app, "status", "--json").stdout)
            if doc["held"]:
                break
            time.sleep(1)
        assert doc["totals"]["held"] == 1, doc["held"]
        [(exit_queue, n)] = doc["held"].items()
        assert exit_queue.startswith(f"hd{uid}.exit.") and n == 1
        shown = run_delayq(app, "status").stdout
        assert max(map(len, shown.splitlines())) <= 80, shown
        table = " ".join(shown.split())
        assert "held 1" in table and exit_queue in table and "binding for their routing key" in table
        from celery_delayq.telemetry.metrics import BrokerCollector

        gauges = {m.name: m.samples[0].value for m in BrokerCollector(app).collect() if len(m.samples) == 1}
        assert gauges["delayq_held_messages"] == 1
    finally:
        run_delayq(app, "topology", "delete", "--discard-messages", "--yes", ok=False)
        ch.queue_delete(queue)
        ch.exchange_delete(exchange)
