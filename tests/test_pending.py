"""``delayq pending`` / ``celery_delayq.pending``: the index of waiting tasks, on a real broker.

Pure parts first (the index layout never interferes with ladder routing; the
frame reader agrees with py-amqp), then the broker: one index entry per pass
through the ladder however many hops, the latest pass wins, due tasks are
never listed, filters, the fast lookup by id, the CLI, and that reading the
index does not disturb the ladder (nothing early, nothing late, no duplicates).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import amqp
import pytest
from hypothesis import given, settings, strategies as st

import celery_delayq
from celery_delayq import DelayedRetryTask, pending
from celery_delayq import headers as H
from celery_delayq.ladder import LadderSpec
from celery_delayq.management import key_matches
from celery_delayq.pending import IndexUnavailable
from celery_delayq.pending.frames import HeaderReader
from celery_delayq.pending.layout import IndexLayout
from celery_delayq.pending.stream import StreamReader
from celery_delayq.topology import Topology
from helpers import Collector, drain, running_worker


# -- pure -----------------------------------------------------------------------------
@pytest.mark.parametrize("radix,levels", [(2, 29), (4, 14), (8, 9), (16, 7), (36, 5)])
def test_index_keys_never_match_a_ladder_binding(radix: int, levels: int) -> None:
    """Every BCC key reaches the index exchange from its own level only, and never a ladder queue."""
    spec = LadderSpec(prefix="1", radix=radix, levels=levels)  # a digit-like prefix changes nothing
    layout = IndexLayout(spec)
    ladder_bindings = spec.bindings()
    index_bindings = layout.bindings()
    for k in range(levels):
        for task_id in ("a", "0", str(uuid.uuid4())):
            (key,) = layout.bcc(spec.level_exchange(k), task_id) or [""]
            assert not any(key_matches("topic", b.routing_key, key) for b in ladder_bindings)
            assert not key_matches("topic", "*." * levels + "0" * 16, key)  # the delivery exchange
            sources = {b.source for b in index_bindings if b.destination == layout.exchange
                       and key_matches("topic", b.routing_key, key)}
            assert sources == {spec.level_exchange(k)}
            shards = [b.destination for b in index_bindings if b.source == layout.exchange
                      and key_matches("topic", b.routing_key, key)]
            assert shards == [layout.shard_queue(layout.shard_of(task_id))]
    assert layout.bcc(spec.delivery_exchange, "x") is None
    assert IndexLayout(spec, index=False).bcc(spec.level_exchange(0), "x") is None


def test_retention_covers_the_longest_delay() -> None:
    spec = LadderSpec()
    layout = IndexLayout(spec)
    assert layout.max_age_s >= spec.max_delay_s + 86400
    args = layout.stream_args(1000)
    assert args["x-queue-type"] == "stream" and args["x-max-age"] == f"{layout.max_age_s}s"
    assert len(layout.shard_queues) == 16 and len(set(layout.shard_queues)) == 16


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                     st.text(max_size=40))
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), _SCALARS,
                                                                               max_size=3))


@settings(max_examples=200, deadline=None)
@given(headers=st.dictionaries(st.text(min_size=1, max_size=30), _VALUES, max_size=25),
       message_id=st.one_of(st.none(), st.text(max_size=30)),
       props=st.fixed_dictionaries({}, optional={"content_type": st.just("application/json"),
                                                 "content_encoding": st.just("utf-8"),
                                                 "delivery_mode": st.just(2), "priority": st.integers(0, 9),
                                                 "correlation_id": st.text(max_size=10),
                                                 "reply_to": st.text(max_size=10)}))
def test_frame_reader_agrees_with_py_amqp(headers: dict[str, Any], message_id: str | None,
                                          props: dict[str, Any]) -> None:
    if message_id is not None:
        props["message_id"] = message_id
    message = amqp.Message(b"body", application_headers=headers or None, **props)
    raw = message._serialize_properties()
    decoded = amqp.Message()
    decoded._load_properties(60, raw, 0)
    expected = decoded.properties.get("application_headers") or {}
    payload = struct.pack(">HHQ", 60, 0, 4) + raw
    wanted = list(headers)[::2] + ["absent"]
    got, mid = HeaderReader(wanted).read(payload)
    assert mid == decoded.properties.get("message_id")
    for key in wanted:
        if key not in expected:
            assert key not in got
        elif isinstance(expected[key], (list, dict)):
            assert got[key] is None
        else:
            assert got[key] == expected[key]


# -- broker ----------------------------------------------------------------------------------
def _index_entries(conn: amqp.Connection, layout: IndexLayout, ids: set[str]) -> list[dict[str, Any]]:
    """Every index entry of ``ids`` (all shards), read with the real reader."""
    out = []
    for shard in sorted({layout.shard_of(i) for i in ids}):
        reader = StreamReader(conn, layout.shard_queue(shard))
        for _offset, headers, _mid in reader.read("first", ("id", H.DUE, H.ENTRY, H.ATTEMPT)):
            if headers.get("id") in ids:
                out.append(headers)
    return out


def test_one_index_entry_per_pass_however_many_hops(private_ladder, amqp_conn: amqp.Connection) -> None:
    """Dead-lettering re-routes with the BCC keys too: only the entry level may copy into the index."""
    topo: Topology = private_ladder(unit_ms=10, levels=4, radix=4)
    topo.index = IndexLayout(topo.spec)
    topo.declare(amqp_conn)
    ch = amqp_conn.channel()
    dest = f"dest.{uuid.uuid4().hex[:6]}"
    ch.queue_declare(dest, durable=True, auto_delete=False)
    d = topo.destination("", dest)
    topo.ensure_exit(amqp_conn, d, declare=True)
    sent = {}
    for units in (3 * 64 + 2 * 16 + 1 * 4 + 3, 5, 16 * 3, 64 + 1):  # 4 hops, 2, 1, 2 (+ the exit queue)
        task_id = str(uuid.uuid4())
        entry, key, hops = topo.spec.route(units, d.token)
        headers = {"id": task_id, H.DUE: time.time() + units / 100, "BCC": topo.index.bcc(entry, task_id)}
        ch.basic_publish(amqp.Message(b"x", application_headers=headers), entry, key)
        sent[task_id] = hops
    try:
        got = drain(amqp_conn, dest, len(sent), timeout=30, key=lambda m: m.headers["id"])
        assert {m.headers["id"] for m in got} == set(sent)
        assert all("BCC" not in m.headers for m in got)  # RabbitMQ strips it
        entries = _index_entries(amqp_conn, topo.index, set(sent))
        assert sorted(e["id"] for e in entries) == sorted(sent), "a hop copied a message into the index again"
    finally:
        with contextlib.suppress(Exception):
            amqp_conn.channel().queue_delete(dest)


def test_pending_lists_waiting_tasks_with_filters(make_app) -> None:
    app = make_app(delayq_enabled=True)
    uid = app.main

    @app.task(name=f"{uid}.charge")
    def charge(order: int) -> None: ...

    @app.task(name=f"{uid}.remind")
    def remind(order: int) -> None: ...

    now = time.time()
    a = charge.apply_async((1,), countdown=600)
    b = charge.apply_async((2,), countdown=900, queue=f"other.{uid}")
    c = remind.apply_async((3,), countdown=1200)
    soon = remind.apply_async((4,), countdown=0.3)
    time.sleep(0.5)  # `soon` is due: delivered or in its last hop, never listed
    mine = [t for t in pending(app) if t.task_name and t.task_name.startswith(uid)]
    assert [t.task_id for t in mine] == [a.id, b.id, c.id]  # soonest due first
    first = mine[0]
    assert first.task_name == f"{uid}.charge" and first.attempt == 0
    assert first.queue == app.conf.task_default_queue and first.routing_key == app.conf.task_default_queue
    assert abs(first.due - (now + 600)) < 5 and first.due_iso.endswith("Z")
    assert mine[1].queue == f"other.{uid}"
    assert [t.task_id for t in pending(app, task=f"{uid}.ch*")] == [a.id, b.id]
    assert [t.task_id for t in pending(app, queue=f"other.{uid}")] == [b.id]
    assert [t.task_id for t in pending(app, task_id=c.id)] == [c.id]
    assert pending(app, task_id=soon.id) == []
    assert pending(app, task_id=str(uuid.uuid4())) == []
    assert [t.task_id for t in pending(app, task=f"{uid}.*", due_before=now + 1000)] == [a.id, b.id]
    assert [t.task_id for t in pending(app, task=f"{uid}.*", due_after=now + 800)] == [b.id, c.id]
    later = pending(app, task=f"{uid}.*", now=now + 1000)
    assert [t.task_id for t in later] == [c.id]  # judged at another time: only what is still waiting then


def test_latest_pass_wins_across_retries(make_app, collector: Collector) -> None:
    app = make_app()
    uid = app.main

    @app.task(base=DelayedRetryTask, bind=True, name=f"{uid}.flaky", max_retries=3)
    def flaky(self: Any) -> None:
        collector.add(attempt=self.request.retries)
        raise self.retry(countdown=300)

    with running_worker(app):
        result = flaky.apply_async(countdown=0.2)
        collector.wait_for(1, timeout=20)
        deadline = time.time() + 10
        found: list[Any] = []
        while time.time() < deadline:
            found = pending(app, task_id=result.id)
            if found and found[0].attempt == 1:
                break
            time.sleep(0.2)
    assert len(found) == 1 and found[0].attempt == 1, found
    assert found[0].due > time.time() + 250


def test_reading_the_index_does_not_disturb_the_ladder(make_app, collector: Collector) -> None:
    """Readers only look: every task runs once, none early, none held up, while pending() reads on."""
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.probe", bind=True)
    def probe(self: Any, due: float) -> None:
        collector.add(id=self.request.id, due=due)

    n = 60
    with running_worker(app):
        ids = set()
        for i in range(n):
            delay = 1.0 + (i % 30) / 10
            ids.add(probe.apply_async((time.time() + delay,), countdown=delay).id)
        reads = 0
        deadline = time.time() + 6
        while time.time() < deadline:
            pending(app, task=f"{app.main}.*")
            reads += 1
        runs = collector.wait_for(n, timeout=30)
        time.sleep(1.0)  # a duplicate would arrive within this
        runs = list(collector.items)
    assert reads >= 3
    assert sorted(r["id"] for r in runs) == sorted(ids), "a task ran twice or not at all"
    lateness = [r["at"] - r["due"] for r in runs]
    assert min(lateness) >= 0, f"ran {-min(lateness):.3f} s early"
    assert max(lateness) < 2.0, f"ran {max(lateness):.3f} s late"
    assert pending(app, task=f"{app.main}.*") == []


def test_index_off_says_so(make_app) -> None:
    app = make_app(delayq_enabled=True, delayq_index=False)
    with pytest.raises(IndexUnavailable, match="delayq_index"):
        pending(app)


def _cli(app_module: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "celery", "-A", app_module.stem, "delayq", *args],
                          cwd=app_module.parent, capture_output=True, text=True, timeout=120, env=env)


CLI_APP = '''
from celery import Celery
app = Celery("{name}", broker="{url}")
app.conf.update(task_default_queue="{queue}", delayq_prefix="{prefix}", delayq_enabled=True, broker_heartbeat=0)

@app.task(name="{name}.later")
def later(x):
    return x
'''


def test_cli_pending_json_table_and_filters(make_app, broker_url: str, prefix: str, tmp_path: Path) -> None:
    name = f"cli{uuid.uuid4().hex[:6]}"
    module = tmp_path / f"{name}.py"
    module.write_text(CLI_APP.format(name=name, url=broker_url, queue=f"q.{name}", prefix=prefix))
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{name}.later")
    def later(x: int) -> int:
        return x

    celery_delayq.install(app).publisher.declare()
    empty = _cli(module, "pending", "--task", f"{name}.*", "--json")
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == []
    r1 = later.apply_async((1,), countdown=3600)
    r2 = later.apply_async((2,), countdown=7200)
    out = _cli(module, "pending", "--task", f"{name}.*", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [d["task_id"] for d in doc] == [r1.id, r2.id]
    assert set(doc[0]) == {"task_id", "task", "exchange", "routing_key", "queue", "due", "attempt"}
    assert doc[0]["task"] == f"{name}.later" and doc[0]["attempt"] == 0 and doc[0]["due"].endswith("Z")
    by_id = _cli(module, "pending", "--id", r2.id, "--json")
    assert [d["task_id"] for d in json.loads(by_id.stdout)] == [r2.id]
    before = _cli(module, "pending", "--task", f"{name}.*", "--due-before", "90m", "--json")
    assert [d["task_id"] for d in json.loads(before.stdout)] == [r1.id]
    table = _cli(module, "pending", "--task", f"{name}.*")
    assert table.returncode == 0 and r1.id in table.stdout and "2 waiting" in table.stdout
    bad = _cli(module, "pending", "--due-after", "tomorrow")
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr


def test_tasks_scheduled_in_batch_are_listed(make_app) -> None:
    """Inside batch() the publisher writes compact entries once the block's confirms are in."""
    from celery_delayq import signals

    app = make_app(delayq_enabled=True)
    uid = app.main

    @app.task(name=f"{uid}.bulk")
    def bulk(i: int) -> None: ...

    bcc: list[Any] = []

    def on(sender: Any = None, headers: Any = None, **_: Any) -> None:
        bcc.append(headers.get("BCC"))

    signals.before_schedule.connect(on, weak=False)
    try:
        with celery_delayq.batch(app):
            ids = [bulk.apply_async((i,), countdown=900 + i).id for i in range(1200)]  # > one chunk per shard
        single = bulk.apply_async((-1,), countdown=950).id
    finally:
        signals.before_schedule.disconnect(on)
    assert bcc[:-1] == [None] * 1200 and bcc[-1]  # the broker copies only the single publish
    found = pending(app, task=f"{uid}.bulk")
    assert sorted(t.task_id for t in found) == sorted(ids + [single])
    assert all(t.queue == app.conf.task_default_queue and t.attempt == 0 for t in found)
    assert [t.task_id for t in pending(app, task_id=ids[700])] == [ids[700]]
    assert abs(pending(app, task_id=ids[5])[0].due - found[0].due - 5) < 1.0
