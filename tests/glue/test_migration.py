"""Each migration path of docs/migration.md, end to end on a real broker with real workers.

* from classic worker ETA: tasks a worker holds at switch-over still run, exactly once, on time;
* from Celery's native delayed delivery: both run side by side, and what sits in ``celery_delayed_*``
  still arrives;
* from the delayed-message plugin: ``x-delay`` precision and maximum, with code written the plugin's way;
* switching back: with ``delayq_enabled`` off, what is already in the ladder is still delivered, on time.

Each test prints one ``MEASURED`` line (run with ``-s``); docs/migration.md quotes them.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import amqp
import pytest
from kombu import Exchange, Queue

from celery_delayq import doctor as D
from celery_delayq import ladder_for
from celery_delayq.errors import DelayTooLong
from helpers import BROKER_HOST, drain, queue_depth, running_worker

pytestmark = pytest.mark.timeout(120)


def management_url() -> str:
    host, _, port = BROKER_HOST.partition(":")
    return f"http://{host}:{int(port or 5672) + 10000}"


def measured(path: str, **numbers: Any) -> None:
    print(f"\nMEASURED {path} on {BROKER_HOST}: " + json.dumps(numbers, sort_keys=True))


def spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "p50": round(statistics.median(values), 3), "max": round(max(values), 3)}


# -- from classic worker ETA -------------------------------------------------------------------------
WORKER_APP = """
import json, os, time
from celery import Celery

app = Celery("mig", broker=os.environ["MIG_BROKER"])
app.conf.update(broker_heartbeat=0, task_default_queue=os.environ["MIG_QUEUE"],
                delayq_prefix=os.environ["MIG_PREFIX"], delayq_enabled=os.environ["MIG_ENABLED"] == "1",
                delayq_management_url=os.environ["MIG_API"], worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True)


@app.task(bind=True, name="mig.record")
def record(self, n):
    with open(os.environ["MIG_RUNS"], "a") as f:
        f.write(json.dumps({"id": self.request.id, "n": n, "at": time.time(), "pid": os.getpid(),
                            "eta": self.request.eta, "ladder": bool(self.request.get("x-delayq-entry"))}) + "\\n")
"""


@contextlib.contextmanager
def worker_process(tmp_path: Path, name: str, env: dict[str, str],
                   prefetch_multiplier: int = 4) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A migapp worker`` in a process of its own (so it can get a real SIGTERM)."""
    log = open(tmp_path / f"{name.split('@')[0]}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "migapp", "worker", "-P", "solo",
                             "-l", "warning", "-c", "1", "-n", name, "--without-gossip", "--without-mingle",
                             "--without-heartbeat", "--prefetch-multiplier", str(prefetch_multiplier)],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()


def runs_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_runs(path: Path, n: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = runs_of(path)
        if len({r["id"] for r in found}) >= n:
            time.sleep(1.0)  # a duplicate would come right after: give it the chance to show
            return runs_of(path)
        time.sleep(0.2)
    raise AssertionError(f"{len(runs_of(path))} of {n} runs within {timeout} s")


def eta_of(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def ready_by(app: Any, worker: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if app.control.ping(destination=[worker], timeout=1.0):
            return
    raise AssertionError(f"worker {worker} did not answer a ping within {timeout} s")


def held_by(app: Any, worker: str, n: int, timeout: float) -> D.Finding:
    """The doctor's worker_eta finding once ``worker`` holds ``n`` ETA tasks."""
    deadline = time.time() + timeout
    while True:
        replies = app.control.inspect(destination=[worker], timeout=1.0).scheduled()
        found = D.worker_eta_finding(replies, enabled=False, timeout=1.0)
        if found.details.get("held", 0) >= n or time.time() > deadline:
            return found


@pytest.mark.parametrize("prefetch", [20, 4], ids=["prefetch-20", "prefetch-4"])
def test_from_worker_eta_held_tasks_run_once_after_the_switch(make_app: Any, broker_url: str, prefix: str,
                                                              uid: str, tmp_path: Path, prefetch: int,
                                                              amqp_conn: amqp.Connection) -> None:
    """Held ETA tasks run once after a SIGTERM restart with the ladder on, whatever the prefetch.

    The new worker moves the handed-back ETA messages into the ladder on arrival
    (celery_delayq.glue.takeover) instead of holding them, so they hold no prefetch slot
    (celery#2731 no longer delays the ladder's own deliveries behind them) and run from the ladder.
    """
    (tmp_path / "migapp.py").write_text(textwrap.dedent(WORKER_APP))
    runs = tmp_path / "runs.jsonl"
    queue = f"q.{uid}"
    env = dict(os.environ, PYTHONPATH=str(tmp_path), MIG_BROKER=broker_url, MIG_QUEUE=queue, MIG_PREFIX=prefix,
               MIG_API=management_url(), MIG_RUNS=str(runs))
    host = socket.gethostname()
    before = make_app()  # the publishers before the switch: delayq_enabled off
    after = make_app(delayq_enabled=True, delayq_management_url=management_url())
    countdown, n_held, n_new = 30.0, 10, 5

    ids: set[str] = set()
    t0 = time.time()
    for i in range(n_held):
        result = before.send_task("mig.record", (i,), countdown=countdown)
        ids.add(result.id)
    with worker_process(tmp_path, f"old.{uid}@%h", dict(env, MIG_ENABLED="0"), prefetch) as old:
        held = held_by(before, f"old.{uid}@{host}", min(n_held, prefetch), timeout=countdown - 10)
        assert held.details.get("held", 0) >= min(n_held, prefetch), held
        t_held = time.time()
        old.send_signal(signal.SIGTERM)  # warm shutdown: the held messages go back to the queue
        old.wait(30)
        t_stopped = time.time()
    returned = queue_depth(amqp_conn, queue)
    assert returned == n_held, f"{returned} of {n_held} held messages back in {queue} after SIGTERM"

    with worker_process(tmp_path, f"new.{uid}@%h", dict(env, MIG_ENABLED="1"), prefetch):
        ready_by(after, f"new.{uid}@{host}", timeout=30)  # its start-up time is not the ladder's lateness
        t_ready = time.time()
        for i in range(n_new):  # published after the switch: through the ladder
            result = after.send_task("mig.record", (100 + i,), countdown=3)
            ids.add(result.id)
        found = wait_for_runs(runs, n_held + n_new, timeout=countdown + 30)

    times = collections.Counter(r["id"] for r in found)
    assert set(times) == ids and set(times.values()) == {1}, times
    lateness = {r["id"]: r["at"] - eta_of(r["eta"]) for r in found}
    assert min(lateness.values()) >= 0.0, lateness  # never early
    # On time once a worker runs: on this shared 2-core machine a worker can take over 10 s to start,
    # so a held task whose eta fell before the new worker was up counts from then. The held ETAs are
    # moved into the ladder, so with any prefetch nothing waits behind them (no celery#2731 stall).
    floor = t_ready
    late_after_ready = {r["id"]: r["at"] - max(eta_of(r["eta"]), floor) for r in found}
    shown = " ".join(f"{r['n']}:{lateness[r['id']]:.2f}" for r in sorted(found, key=lambda r: r["n"]))
    assert max(late_after_ready.values()) < 5.0, f"task:lateness {shown}; new worker ready at {t_ready - t0:.1f} s"
    old_ones = [r for r in found if r["n"] < 100]
    new_ones = [r for r in found if r["n"] >= 100]
    # What was still waiting when the new worker was up goes through the ladder; a held task whose eta fell
    # while no worker ran (a slow start on a loaded host) is due on arrival and simply runs.
    waiting = [r for r in found if eta_of(r["eta"]) > t_ready + 1.0]
    assert waiting and all(r["ladder"] for r in waiting), "the new worker moves handed-back ETAs into the ladder"
    assert len({r["pid"] for r in found}) == 1  # all ran in the new worker
    measured(f"worker-eta prefetch {prefetch}", held=held.details["held"], returned_on_sigterm=returned,
             runs=len(found), distinct=len(times), countdown_s=countdown,
             phases_s={"held": round(t_held - t0, 1), "stopped": round(t_stopped - t0, 1),
                       "new_worker_ready": round(t_ready - t0, 1)},
             held_lateness_s=spread([lateness[r["id"]] for r in old_ones]),
             ladder_lateness_s=spread([lateness[r["id"]] for r in new_ones]))


# -- from Celery's native delayed delivery -----------------------------------------------------------
@pytest.fixture
def native_apps(make_app: Any, uid: str, vhost: str, amqp_conn: amqp.Connection) -> Iterator[tuple[Any, Any]]:
    """(before, after): apps with a quorum queue behind a topic exchange, so Celery's native delayed
    delivery is active; ``after`` has the ladder on. The native topology is declared as Celery's worker does."""
    from kombu.transport.native_delayed_delivery import (bind_queue_to_native_delayed_delivery_exchange,
                                                         declare_native_delayed_delivery_exchanges_and_queues)

    def conf(**extra: Any) -> dict[str, Any]:
        exchange = Exchange(f"nx.{uid}", type="topic")
        return dict(task_default_queue=f"nq.{uid}", task_default_exchange=f"nx.{uid}",
                    task_default_exchange_type="topic", task_default_routing_key=f"nq.{uid}",
                    task_queues=[Queue(f"nq.{uid}", exchange, routing_key=f"nq.{uid}",
                                       queue_arguments={"x-queue-type": "quorum"})], **extra)

    before = make_app(**conf())
    after = make_app(**conf(delayq_enabled=True, delayq_management_url=management_url()))
    with before.connection_for_write() as conn:
        declare_native_delayed_delivery_exchanges_and_queues(conn, "quorum")
        for queue in before.amqp.queues.values():
            queue(conn.default_channel).declare()
            bind_queue_to_native_delayed_delivery_exchange(conn, queue)
    yield before, after
    ch = amqp_conn.channel()
    for name in D.native_queue_names():
        with contextlib.suppress(Exception):
            ch.queue_delete(name)
    for name in [*D.native_queue_names(), D.NATIVE_DELIVERY_EXCHANGE, f"nx.{uid}"]:
        with contextlib.suppress(Exception):
            ch.exchange_delete(name)
    with contextlib.suppress(Exception):
        ch.queue_delete(f"nq.{uid}")


def native_waiting(conn: amqp.Connection) -> int:
    return sum(queue_depth(conn, name) for name in D.native_queue_names())


def test_from_native_delayed_delivery_both_run_side_by_side(native_apps: tuple[Any, Any], collector: Any,
                                                            amqp_conn: amqp.Connection, uid: str) -> None:
    before, after = native_apps
    countdown, n = 6.0, 5

    @after.task(bind=True, name=f"mig.native.{uid}")
    def record(self: Any, path: str) -> None:
        collector.add(id=self.request.id, path=path, ladder=bool(self.request.get("x-delayq-entry")),
                      eta=self.request.eta)

    ids: set[str] = set()
    for _ in range(n):  # before the switch: Celery's own ladder
        result = before.send_task(f"mig.native.{uid}", ("native",), countdown=countdown)
        ids.add(result.id)
    deadline = time.time() + 5
    while native_waiting(amqp_conn) < n and time.time() < deadline:
        time.sleep(0.1)
    in_native = native_waiting(amqp_conn)
    assert in_native == n
    with running_worker(after):  # the switch: a worker (and publishers) with the ladder on
        for _ in range(n):
            result = after.send_task(f"mig.native.{uid}", ("ladder",), countdown=countdown)
            ids.add(result.id)
        assert native_waiting(amqp_conn) <= n  # the new ones skipped Celery's ladder
        runs = collector.wait_for(2 * n, timeout=countdown + 20)
        time.sleep(1.0)
    times = collections.Counter(r["id"] for r in collector.items)
    assert set(times) == ids and set(times.values()) == {1}, times
    lateness = {r["id"]: r["at"] - eta_of(r["eta"]) for r in runs}
    assert min(lateness.values()) >= 0.0 and max(lateness.values()) < 5.0, lateness
    native = [r for r in runs if r["path"] == "native"]
    ladder = [r for r in runs if r["path"] == "ladder"]
    assert not any(r["ladder"] for r in native) and all(r["ladder"] for r in ladder)
    assert native_waiting(amqp_conn) == 0
    measured("native", in_native_queues_at_switch=in_native, runs=len(runs), distinct=len(times),
             native_lateness_s=spread([lateness[r["id"]] for r in native]),
             ladder_lateness_s=spread([lateness[r["id"]] for r in ladder]))


# -- from the delayed-message plugin ------------------------------------------------------------------
def test_from_the_plugin_x_delay_precision_and_maximum(make_app: Any, amqp_conn: amqp.Connection, uid: str) -> None:
    """Code written for the plugin, unchanged: an ``x-delayed-message`` exchange and ``x-delay`` in ms."""
    app = make_app(delayq_enabled=True, delayq_management_url=management_url(), delayq_max_delay=3600)
    delayed = Exchange(f"delayed.{uid}", type="x-delayed-message", arguments={"x-delayed-type": "direct"})
    queue = Queue(f"dq.{uid}", delayed, routing_key="k")
    delays_ms = [1001, 1234, 1505, 1999, 2333, 2505, 3007, 3333]
    sent: dict[int, float] = {}
    try:
        with app.producer_or_acquire() as producer:
            for ms in delays_ms:
                sent[ms] = time.time()
                producer.publish({"ms": ms}, exchange=delayed, routing_key="k", headers={"x-delay": ms},
                                 declare=[queue], serializer="json")
            # The plugin took up to 2^32-1 ms and delivered longer x-delays at once; the ladder takes
            # any delay (laps), up to delayq_max_delay when one is set, and refuses what exceeds it.
            with pytest.raises(DelayTooLong, match="delayq_max_delay"):
                producer.publish({"ms": 7_200_000}, exchange=delayed, routing_key="k",
                                 headers={"x-delay": 7_200_000}, declare=[queue], serializer="json")
        got = drain(amqp_conn, f"dq.{uid}", len(delays_ms), timeout=20, key=lambda m: json.loads(m.body)["ms"])
        time.sleep(0.5)
        assert queue_depth(amqp_conn, f"dq.{uid}") == 0  # the refused one was never sent
    finally:
        ch = amqp_conn.channel()
        ch.queue_delete(f"dq.{uid}")
        ch.exchange_delete(f"delayed.{uid}")
    lateness, end_to_end = [], []
    for m in got:
        ms = json.loads(m.body)["ms"]
        arrived = m.arrived  # type: ignore[attr-defined]
        lateness.append(arrived - float(m.headers["x-delayq-due"]))  # publish time + x-delay, as the ladder saw it
        end_to_end.append(arrived - (sent[ms] + ms / 1000.0))  # from before the publish call
        assert m.headers["x-delay"] == -ms  # as the plugin delivers it: negative, so a republish is not delayed again
    assert min(lateness) >= 0.0, lateness  # never early
    assert max(end_to_end) < 2.0, end_to_end
    measured("plugin", messages=len(got), lateness_s=spread(lateness), end_to_end_lateness_s=spread(end_to_end),
             ladder_span_s=ladder_for(app).config.spec.max_delay_s, plugin_max_delay_s=D.PLUGIN_MAX_DELAY_MS / 1000.0)


# -- switching back -----------------------------------------------------------------------------------
def test_switching_back_the_ladder_still_delivers_on_time(make_app: Any, collector: Any, uid: str) -> None:
    on = make_app(delayq_enabled=True, delayq_management_url=management_url())
    off = make_app()  # delayq_enabled off: no hook on its producers, a plain Celery worker
    countdown, n = 5.0, 5

    @off.task(bind=True, name=f"mig.back.{uid}")
    def record(self: Any, path: str) -> None:
        collector.add(id=self.request.id, path=path, ladder=bool(self.request.get("x-delayq-entry")),
                      eta=self.request.eta)

    ids: set[str] = set()
    for _ in range(n):  # in the ladder when the switch back happens
        result = on.send_task(f"mig.back.{uid}", ("ladder",), countdown=countdown)
        ids.add(result.id)
    import celery_delayq

    assert not celery_delayq.is_installed(off)
    with running_worker(off):
        result = off.send_task(f"mig.back.{uid}", ("eta",), countdown=2)  # after the switch back: a worker ETA
        ids.add(result.id)
        runs = collector.wait_for(n + 1, timeout=countdown + 20)
        time.sleep(1.0)
    times = collections.Counter(r["id"] for r in collector.items)
    assert set(times) == ids and set(times.values()) == {1}, times
    lateness = {r["id"]: r["at"] - eta_of(r["eta"]) for r in runs}
    assert min(lateness.values()) >= 0.0 and max(lateness.values()) < 5.0, lateness
    ladder = [r for r in runs if r["path"] == "ladder"]
    assert all(r["ladder"] for r in ladder) and len(ladder) == n
    measured("switch-back", runs=len(runs), distinct=len(times),
             ladder_lateness_s=spread([lateness[r["id"]] for r in ladder]),
             eta_lateness_s=spread([lateness[r["id"]] for r in runs if r["path"] == "eta"]))


def test_switching_back_keeps_a_relay_for_delays_longer_than_the_ladder(make_app: Any, collector: Any, uid: str,
                                                                         vhost: str,
                                                                         amqp_conn: amqp.Connection) -> None:
    """A delay longer than the ladder waits between laps in ``<prefix>.laps``; only a worker with the ladder
    installed puts it back. A worker without it leaves it there (late, not lost) until one runs."""
    import celery_delayq
    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.rabbitmq.topology import Topology

    shape = dict(delayq_prefix=f"sb{uid}", delayq_levels=2, delayq_unit_ms=1000)  # the ladder holds 15 s
    on = make_app(delayq_enabled=True, delayq_management_url=management_url(), **shape)
    off = make_app(**shape)
    spec = LadderSpec(prefix=f"sb{uid}", levels=2, unit_ms=1000)
    countdown = 20.0

    @off.task(bind=True, name=f"mig.lap.{uid}")
    def record(self: Any) -> None:
        collector.add(id=self.request.id, eta=self.request.eta)

    try:
        result = on.send_task(f"mig.lap.{uid}", countdown=countdown)
        due = time.time() + countdown
        with running_worker(off):  # switched back: no relay
            time.sleep(max(0.0, due + 4 - time.time()))
            assert len(collector) == 0
            state = Topology(spec, "quorum").inspect(amqp_conn)
            stuck = D.ladder_finding(state, spec, "quorum", declare=True)
        assert stuck.status == "warn" and stuck.details["laps"]["messages"] == 1, stuck
        assert "no worker relays them" in stuck.summary
        celery_delayq.install(off)  # the ladder installed in the worker, delayq_enabled still off
        with running_worker(off):
            (run,) = collector.wait_for(1, timeout=20)
            time.sleep(1.0)
        assert len(collector) == 1 and run["id"] == result.id
        measured("switch-back laps", stuck_for_s=round(run["at"] - eta_of(run["eta"]), 2),
                 laps_waiting_without_relay=stuck.details["laps"]["messages"])
    finally:
        Topology(spec, "quorum").delete(amqp_conn, if_empty=False)
        with contextlib.suppress(Exception):
            amqp_conn.channel().queue_delete(spec.laps_queue)
