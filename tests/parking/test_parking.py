"""Parking with a real worker, and list/inspect/replay/purge on the real broker, including a killed replay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from celery_delayq import DelayedRetryTask
from celery_delayq.ladder import headers as H
from celery_delayq.parking import ParkedFilter, ParkedMessageNotFound, ParkingFailed, ParkingQueue
from celery_delayq.parking.record import REPLAY
from helpers import drain, queue_depth, running_worker
from retry_helpers import (  # noqa: F401  (fixtures)
    Events, events_fixture, park_synthetic, parked_fixture, parking_name_fixture, record_run, retry_app_fixture,
)

pytestmark = pytest.mark.timeout(60)


# -- parking from a worker ------------------------------------------------------------------
def test_exhausted_retries_park_the_original_message_with_failure_metadata(
        retry_app, collector, events: Events, parked: ParkingQueue, amqp_conn, uid: str) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True, max_retries=1, default_retry_delay=0.1)
    def charge(self, amount, currency, *, note):
        record_run(collector, self)
        try:
            raise IOError(f"gateway down for {amount} {currency}")
        except IOError as exc:
            raise self.retry(exc=exc)

    with running_worker(app):
        res = charge.apply_async((12, "EUR"), {"note": "n1"}, headers={"tenant": "t1"}, priority=3)
        with pytest.raises(IOError):
            res.get(timeout=10)
        runs = collector.wait_for(2)
    assert res.state == "FAILURE"  # Celery's own failure handling still happens
    assert [f["id"] for f in events.failures] == [res.id]
    assert [(e["id"], e["attempt"]) for e in events.exhausted] == [(res.id, 2)]
    assert [(e["id"], e["queue"]) for e in events.parked] == [(res.id, parked.name)]
    assert queue_depth(amqp_conn, f"q.{uid}") == 0  # acked after the park

    (p,) = parked.list()
    assert (p.task, p.task_id, p.attempts, p.reason) == (charge.name, res.id, 2, "exhausted")
    assert p.exc_type == "builtins.OSError" and p.exc_message == "gateway down for 12 EUR"
    assert "raise IOError" in p.traceback
    assert p.first_attempt == pytest.approx(runs[0]["at"], abs=0.05)
    assert p.last_attempt == pytest.approx(runs[1]["at"], abs=0.05)
    assert (p.exchange, p.routing_key) == ("", f"q.{uid}")
    # the original message as the worker got it: Celery headers, custom headers, body, properties
    assert p.headers["id"] == res.id and p.headers["task"] == charge.name and p.headers["retries"] == 1
    assert p.headers["tenant"] == "t1" and "x-death" not in p.headers
    args, kwargs, _embed = json.loads(p.body)
    assert (args, kwargs) == ([12, "EUR"], {"note": "n1"})
    assert p.properties["correlation_id"] == res.id and p.properties["priority"] == 3
    assert p.properties["content_type"] == "application/json" and p.properties["delivery_mode"] == 2


def test_park_on_parks_at_once_for_an_early_ack_task(retry_app, collector, events: Events, parked) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, acks_late=False, autoretry_for=(Exception,),
              delayq_park_on=(ValueError,))
    def parse(self, text):
        record_run(collector, self)
        raise ValueError(f"bad input {text!r}")

    with running_worker(app):
        res = parse.delay("x")
        with pytest.raises(ValueError):
            res.get(timeout=10)
    assert len(collector.items) == 1 and not events.scheduled and not events.exhausted
    (p,) = parked.list()
    assert p.reason == "park_on" and p.attempts == 1 and p.exc_type == "builtins.ValueError"
    assert res.state == "FAILURE"


def test_parking_off_means_celery_only(retry_app, collector, events: Events, parked) -> None:
    app = retry_app(delayq_park=False)

    @app.task(base=DelayedRetryTask, bind=True, max_retries=0)
    def once(self):
        record_run(collector, self)
        raise self.retry(exc=IOError("x"), countdown=0.1)

    with running_worker(app):
        with pytest.raises(IOError):
            once.delay().get(timeout=10)
    assert len(events.exhausted) == 1 and not events.parked and parked.count() == 0


def test_a_refused_park_fails_the_task_loudly(retry_app, collector, amqp_conn, parking_name: str) -> None:
    amqp_conn.channel().queue_declare(parking_name, durable=True, auto_delete=False,
                                      arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, delayq_park_on=(ValueError,))
    def doomed(self):
        raise ValueError("x")

    with running_worker(app):
        res = doomed.delay()
        with pytest.raises(ParkingFailed, match="NOT parked"):
            res.get(timeout=10)


# -- replay of what a worker parked -----------------------------------------------------------
def test_replay_runs_the_task_again_as_one_more_attempt_or_afresh(retry_app, collector, parking_name: str) -> None:
    app = retry_app()
    parked = ParkingQueue.for_app(app)  # the app's queue, with its ladder for delayed replays
    assert parked.name == parking_name
    fixed = {"now": False}

    @app.task(base=DelayedRetryTask, bind=True, max_retries=1, default_retry_delay=0.05)
    def sync(self, n):
        record_run(collector, self, n=n)
        if not fixed["now"]:
            raise self.retry(exc=IOError("down"))
        return n

    with running_worker(app):
        results = [sync.delay(n) for n in range(3)]
        collector.wait_for(6)
        assert parked.count() == 3
        fixed["now"] = True
        first = parked.list(ParkedFilter(ids=()), limit=1)[0]
        report = parked.replay(ParkedFilter(ids=(first.parked_id[:10],)))
        assert report.replayed == 1 and report.skipped == 2
        again = collector.wait_for(7)[-1]
        assert (again["id"], again["retries"], again["replay"]) == (first.task_id, 1, first.parked_id)
        report = parked.replay(reset_attempts=True, delay=0.5)
        t0 = time.time()
        runs = collector.wait_for(9)[-2:]
    assert report.replayed == 2 and parked.count() == 0
    assert all(r["retries"] == 0 and r["delay"] == 0.5 and r["at"] - t0 >= 0.45 for r in runs)
    assert sorted(r.get(timeout=5) for r in results if r.id != first.task_id) == sorted(
        r["n"] for r in runs)


# -- list, inspect, purge ---------------------------------------------------------------------
@pytest.fixture
def dest(amqp_conn, uid: str):
    name = f"dest.{uid}"
    amqp_conn.channel().queue_declare(name, durable=True, auto_delete=False)
    yield name
    amqp_conn.channel().queue_delete(name)


def test_list_filters_inspect_and_purge(broker_url: str, parked: ParkingQueue, dest: str) -> None:
    old = time.time() - 3600
    a = park_synthetic(broker_url, parked.name, 3, task="proj.billing.charge", exc=TimeoutError("t"), dest=dest,
                       parked_at=old)
    b = park_synthetic(broker_url, parked.name, 2, task="proj.mail.send", exc=KeyError("k"), dest=dest)
    assert parked.count() == 5
    assert [p.parked_id for p in parked.list()] == a + b  # oldest first, and the queue is untouched
    assert [p.parked_id for p in parked.list(ParkedFilter(task="proj.billing.*"))] == a
    assert [p.parked_id for p in parked.list(ParkedFilter(exception="*Error"))] == a + b
    assert [p.parked_id for p in parked.list(ParkedFilter(exception="builtins.KeyError"))] == b
    assert [p.parked_id for p in parked.list(ParkedFilter(since=old + 60))] == b
    assert [p.parked_id for p in parked.list(ParkedFilter(until=old + 60))] == a
    assert len(parked.list(limit=2)) == 2
    assert parked.get(b[1][:8]).exc_type == "builtins.KeyError"
    with pytest.raises(ParkedMessageNotFound, match="delayq parking list"):
        parked.get("zzzz")
    assert parked.purge(ParkedFilter(task="proj.mail.*")) == 2
    assert [p.parked_id for p in parked.list()] == a
    assert parked.purge() == 3 and parked.count() == 0


def test_replay_restores_the_message_and_leaves_unroutable_ones_parked(
        broker_url: str, parked: ParkingQueue, dest: str, amqp_conn) -> None:
    ids = park_synthetic(broker_url, parked.name, 3, exc=IOError("x"), dest=dest)
    park_synthetic(broker_url, parked.name, 1, exc=IOError("x"), dest=f"{dest}.gone")
    report = parked.replay(batch_size=2)
    assert (report.replayed, report.unroutable) == (3, 1)
    got = drain(amqp_conn, dest, 3, timeout=5)
    assert [m.headers[REPLAY] for m in got] == ids
    m = got[0]
    assert m.headers["retries"] == 3 and "x-delayq-parked-id" not in m.headers and H.DUE not in m.headers
    assert json.loads(m.body) == [[0], {}, {}] and m.properties["correlation_id"] == m.headers["id"]
    assert parked.count() == 1 and parked.list()[0].routing_key == f"{dest}.gone"


# -- a replay killed half-way neither loses nor duplicates ------------------------------------------
REPLAY_SCRIPT = """
import os, signal, sys, amqp, kombu
from celery_delayq.parking import ParkingQueue
broker, queue, kill_at, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
acks = [0]
real_ack = amqp.Channel.basic_ack
def ack_then_maybe_die(self, tag, *a, **kw):
    acks[0] += 1
    if acks[0] == kill_at:  # the copy is published, the original not yet acked
        os.kill(os.getpid(), signal.SIGKILL)
    return real_ack(self, tag, *a, **kw)
amqp.Channel.basic_ack = ack_then_maybe_die
with ParkingQueue(kombu.Connection(broker), queue) as pq:
    pq.replay(batch_size=batch, progress=lambda done, total: print(done, total, flush=True))
"""


def run_replay(tmp_path, broker_url: str, queue: str, kill_at: int, batch: int) -> subprocess.CompletedProcess:
    script = tmp_path / "replay_kill.py"
    script.write_text(REPLAY_SCRIPT)
    return subprocess.run([sys.executable, str(script), broker_url, queue, str(kill_at), str(batch)],
                          capture_output=True, text=True, timeout=40)


def check_exactly_once(parked: ParkingQueue, amqp_conn, dest: str, ids: list[str]) -> list[str]:
    """Every message is still parked or replayed exactly once (consumed here); returns the replayed ids."""
    # The broker returns a dead client's unacked messages once it has noticed the closed socket.
    deadline = time.time() + 10
    while queue_depth(amqp_conn, parked.name) + queue_depth(amqp_conn, dest) < len(ids) and time.time() < deadline:
        time.sleep(0.05)
    still = [p.parked_id for p in parked.list(limit=10_000)]
    replayed_n = queue_depth(amqp_conn, dest)
    replayed = [m.headers[REPLAY] for m in drain(amqp_conn, dest, replayed_n, timeout=10)] if replayed_n else []
    assert not [k for k, v in Counter(replayed).items() if v > 1], "a message was replayed twice"
    assert sorted(still + replayed) == sorted(ids), "a message was lost"
    return replayed


def test_replay_killed_between_publish_and_ack(tmp_path, broker_url: str, parked, dest: str, amqp_conn) -> None:
    ids = park_synthetic(broker_url, parked.name, 7, exc=IOError("x"), dest=dest)
    proc = run_replay(tmp_path, broker_url, parked.name, kill_at=6, batch=2)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # batches of 2 committed twice; the killed third batch had published 2 copies and acked one
    first = check_exactly_once(parked, amqp_conn, dest, ids)
    assert first == ids[:4]
    assert parked.replay().replayed == 3  # a second run finishes the job
    assert check_exactly_once(parked, amqp_conn, dest, ids[4:]) == ids[4:] and parked.count() == 0


def test_replay_killed_at_a_random_moment(tmp_path, broker_url: str, parked, dest: str, amqp_conn) -> None:
    ids = park_synthetic(broker_url, parked.name, 150, exc=IOError("x"), dest=dest)
    script = tmp_path / "replay_kill.py"
    script.write_text(REPLAY_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), broker_url, parked.name, "0", "1"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until it is well under way, then kill it mid-flight
        if int(line.split()[0]) >= 40:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=20)
    assert proc.returncode == -signal.SIGKILL
    replayed = check_exactly_once(parked, amqp_conn, dest, ids)
    assert 40 <= len(replayed) < 150


def test_an_exact_selection_acts_on_the_counted_messages_only(broker_url: str, parked: ParkingQueue, dest: str,
                                                               amqp_conn) -> None:
    """``ParkedFilter(exactly=...)``: what a confirmed count acts on; a message parked since is left alone."""
    counted = park_synthetic(broker_url, parked.name, 2, exc=IOError("x"), dest=dest)
    since = park_synthetic(broker_url, parked.name, 2, exc=IOError("x"), dest=dest)
    assert parked.replay(ParkedFilter(exactly=frozenset(counted[:1]))).replayed == 1
    assert parked.purge(ParkedFilter(exactly=frozenset(counted[1:]))) == 1
    assert [p.parked_id for p in parked.list()] == since
    nothing = ParkedFilter(exactly=frozenset())
    assert not nothing.everything and parked.list(nothing) == [] and parked.purge(nothing) == 0
    assert parked.count() == 2
    assert [m.headers[REPLAY] for m in drain(amqp_conn, dest, 1, timeout=5)] == counted[:1]
