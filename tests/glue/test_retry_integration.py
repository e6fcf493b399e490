"""Retries with a real worker on the real broker: Celery's options, tenacity policies, RetryAfter.

Countdowns are observed twice: exactly, as Celery computed them (the
``retry_scheduled`` signal carries the countdown Celery passed on), and as
the ladder applied them (``x-delayq-delay`` on the delivered retry, and the
time between runs).
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta, timezone

import pytest
import tenacity
from celery.utils.time import get_exponential_backoff_interval
from tenacity import retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential, wait_fixed, wait_random

from celery_delayq import DelayedRetryTask
from celery_delayq.ladder import headers as H
from celery_delayq.policies import RetryAfter
from helpers import running_worker
from retry_helpers import (  # noqa: F401  (fixtures)
    Events, events_fixture, parked_fixture, parking_name_fixture, record_run, retry_app_fixture,
)

pytestmark = pytest.mark.timeout(60)


def assert_ladder_waited(runs: list[dict], countdowns: list[float]) -> None:
    """Each retry arrived through the ladder with the countdown asked for, never early."""
    assert len(runs) == len(countdowns) + 1
    for before, after, countdown in zip(runs, runs[1:], countdowns):
        if countdown <= 0:
            continue  # "run now": published without the ladder, as Celery does
        # The delay header is due minus the moment of the ladder publish: never more than asked, and
        # less by the time from retry() to that publish (a few ms; ~75 ms seen on a machine at load 13).
        assert countdown - 0.25 <= after["delay"] <= countdown + 0.01, (after["delay"], countdown)
        assert after["at"] >= after["due"] - 0.001, "delivered before it was due"
        assert after["at"] - before["at"] >= countdown - 0.05


# -- 1. Celery's own options ------------------------------------------------------------------
def test_autoretry_backoff_matches_celerys_formula_and_cap(retry_app, collector, events: Events, parked) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True, autoretry_for=(IOError,), retry_backoff=True,
              retry_backoff_max=2, retry_jitter=False, max_retries=3)
    def flaky(self):
        record_run(collector, self)
        raise IOError("down")

    with running_worker(app):
        res = flaky.delay()
        runs = collector.wait_for(4, timeout=20)
        with pytest.raises(IOError):
            res.get(timeout=10)
    expected = [get_exponential_backoff_interval(factor=1, retries=n, maximum=2) for n in range(3)]
    assert expected == [1, 2, 2]
    assert events.countdowns(res.id) == expected
    assert_ladder_waited(runs, expected)
    assert [r["retries"] for r in runs] == [0, 1, 2, 3]
    assert res.state == "FAILURE"
    assert [e["attempt"] for e in events.exhausted] == [4]
    assert len(parked.list()) == 1 and parked.list()[0].attempts == 4


def test_jitter_draws_what_celery_draws(retry_app, collector, events: Events) -> None:
    app = retry_app()
    seed = random.randrange(10**6)

    @app.task(base=DelayedRetryTask, bind=True, autoretry_for=(IOError,), retry_backoff=1, retry_backoff_max=2,
              retry_jitter=True, max_retries=3)
    def jittery(self):
        record_run(collector, self)
        if self.request.retries < 3:
            random.seed(seed + self.request.retries)  # the draw Celery makes next is now known
            raise IOError("down")

    with running_worker(app):
        res = jittery.delay()
        runs = collector.wait_for(4, timeout=20)
        res.get(timeout=10)
    expected = []
    for n in range(3):
        random.seed(seed + n)
        expected.append(get_exponential_backoff_interval(factor=1, retries=n, maximum=2, full_jitter=True))
    assert events.countdowns(res.id) == expected
    assert all(0 <= c <= min(2, 2**n) for n, c in enumerate(expected))
    assert_ladder_waited(runs, expected)


def test_max_retries_none_retries_until_success(retry_app, collector, events: Events, parked) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, max_retries=None)
    def patient(self):
        record_run(collector, self, x_death="x-death" in (self.request.headers or {}))
        if self.request.retries < 5:  # more than Celery's default of 3
            raise self.retry(countdown=0.05 if self.request.retries % 2 == 0 else 0)  # ladder, then "now"
        return "done"

    with running_worker(app):
        assert patient.delay().get(timeout=20) == "done"
    runs = collector.items
    assert [r["retries"] for r in runs] == [0, 1, 2, 3, 4, 5]
    assert not events.exhausted and parked.count() == 0
    # After a ladder pass (x-death present), an undelayed retry must not republish RabbitMQ's x-death.
    assert [r["x_death"] for r in runs] == [False, True, False, True, False, True]


class Boom(Exception):
    pass


def test_retry_countdown_eta_default_delay_exc_and_max_retries(retry_app, collector, events: Events, parked) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True, default_retry_delay=0.2)
    def manual(self):
        record_run(collector, self)
        n = self.request.retries
        try:
            raise KeyError("inner")
        except KeyError:
            if n == 0:
                raise self.retry(countdown=0.3)
            if n == 1:
                raise self.retry(eta=datetime.now(timezone.utc) + timedelta(seconds=0.4))
            if n == 2:
                raise self.retry()  # default_retry_delay
            raise self.retry(exc=Boom("gave up"), max_retries=3)  # 4th retry > 3: Celery raises exc

    with running_worker(app):
        res = manual.delay()
        runs = collector.wait_for(4, timeout=20)
        with pytest.raises(Boom, match="gave up"):
            res.get(timeout=10)
    countdowns = events.countdowns(res.id)
    assert countdowns[0] == 0.3 and countdowns[2] == 0.2
    assert countdowns[1] == pytest.approx(0.4, abs=0.05)
    assert_ladder_waited(runs, countdowns)
    assert runs[2]["eta"] is not None  # request.eta is Celery's eta even though the ladder waited
    (p,) = parked.list()
    assert p.exc_type.endswith("Boom") and p.reason == "exhausted" and p.attempts == 4


def test_dont_autoretry_for_and_retry_kwargs(retry_app, collector, events: Events, parked) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, autoretry_for=(Exception,), dont_autoretry_for=(KeyError,),
              retry_kwargs={"countdown": 0.2, "max_retries": 1})
    def picky(self, kind):
        record_run(collector, self, kind=kind)
        if kind == "key" and self.request.retries == 1:
            raise KeyError("not retried")
        raise IOError("retried")

    with running_worker(app):
        key, io = picky.delay("key"), picky.delay("io")
        with pytest.raises(KeyError):
            key.get(timeout=10)
        with pytest.raises(IOError):
            io.get(timeout=10)
    assert events.countdowns(key.id) == [0.2] and events.countdowns(io.id) == [0.2]
    assert len([r for r in collector.items if r["kind"] == "key"]) == 2
    # Only the exhausted one is parked; a non-retried exception just fails.
    assert [p.task_id for p in parked.list()] == [io.id]
    assert {f["id"] for f in events.failures} == {key.id, io.id}


# -- 2. tenacity policies ------------------------------------------------------------------------
def test_tenacity_policy_waits_stops_and_filters(retry_app, collector, events: Events, parked) -> None:
    app = retry_app()
    policy = tenacity.Retrying(wait=wait_exponential(multiplier=0.1, max=60) + wait_random(0, 0.05),
                               stop=stop_after_attempt(4), retry=retry_if_exception_type(IOError))

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True, delayq_policy=policy)
    def fetch(self, kind):
        record_run(collector, self, kind=kind)
        raise IOError("flaky") if kind == "io" else KeyError("bug")

    with running_worker(app):
        io, bug = fetch.delay("io"), fetch.delay("bug")
        with pytest.raises(KeyError):
            bug.get(timeout=10)
        with pytest.raises(IOError):
            io.get(timeout=20)
    runs = [r for r in collector.items if r["kind"] == "io"]
    countdowns = events.countdowns(io.id)
    assert len(countdowns) == 3 and len(runs) == 4  # stop_after_attempt(4)
    for n, c in enumerate(countdowns, start=1):
        base = wait_exponential(multiplier=0.1, max=60)(_attempt(n))
        assert base <= c <= base + 0.05
    assert_ladder_waited(runs, countdowns)
    # the first attempt's wall-clock time travels with every retry
    assert len({r["first"] for r in runs[1:]}) == 1 and runs[1]["first"] == pytest.approx(runs[0]["at"], abs=0.05)
    assert len([r for r in collector.items if r["kind"] == "bug"]) == 1  # not retryable: fails at once
    assert [p.task_id for p in parked.list()] == [io.id]
    assert [e["attempt"] for e in events.exhausted] == [4]


def _attempt(n: int):
    from celery_delayq.policies import call_state

    return call_state(attempt_number=n, first_attempt=time.time())


def test_stop_after_delay_holds_across_workers(retry_app, collector, events: Events, parked) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True, delayq_wait=wait_fixed(2.0),
              delayq_stop=stop_after_delay(1.5), max_retries=None)
    def slow(self):
        record_run(collector, self)
        raise IOError("still down")

    with running_worker(app):
        res = slow.delay()
        collector.wait_for(1, timeout=10)
    # The retry waits in the ladder while no worker runs; a new worker picks it up.
    with running_worker(app):
        runs = collector.wait_for(2, timeout=10)
        with pytest.raises(IOError):
            res.get(timeout=10)
    # 2 s after the first attempt > 1.5 s: the second worker stops, although for it this is
    # the first attempt it sees. Without the carried first-attempt time it would retry.
    assert len(runs) == 2 and events.countdowns(res.id) == [2.0]
    (p,) = parked.list()
    assert p.first_attempt == pytest.approx(runs[0]["at"], abs=0.05)
    assert p.attempts == 2 and p.reason == "exhausted"


# -- 3. explicit delays ----------------------------------------------------------------------------
def test_retry_after_is_used_as_given_and_capped(retry_app, collector, events: Events) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, delayq_max_delay=0.4)
    def polite(self):
        record_run(collector, self)
        if self.request.retries == 0:
            raise RetryAfter(0.3, exc=ConnectionError("429"))
        if self.request.retries == 1:
            raise RetryAfter(3600)  # the server asks for an hour; the task's cap says 0.4 s
        return "ok"

    with running_worker(app):
        res = polite.delay()
        assert res.get(timeout=10) == "ok"
    assert events.countdowns(res.id) == [0.3, 0.4]
    assert isinstance(events.scheduled[0]["exc"], ConnectionError)  # the underlying error is reported
    assert_ladder_waited(collector.items, [0.3, 0.4])


def test_retry_after_caught_by_autoretry_keeps_its_delay(retry_app, collector, events: Events) -> None:
    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, autoretry_for=(Exception,), retry_backoff=5, max_retries=2)
    def polite(self):
        record_run(collector, self)
        if self.request.retries == 0:
            raise RetryAfter(0.25)
        return "ok"

    with running_worker(app):
        assert polite.delay().get(timeout=10) == "ok"
    assert [e["countdown"] for e in events.scheduled] == [0.25]  # not Celery's 5 s backoff


# -- a worker killed between a retry's publish and its ack ------------------------------------------
KILL_APP = '''
import os, signal
from celery import Celery, signals as celery_signals
from celery_delayq import DelayedRetryTask, signals

app = Celery("killapp", broker=os.environ["BROKER"])
app.conf.update(broker_heartbeat=0, task_default_queue=os.environ["QUEUE"], delayq_prefix=os.environ["PREFIX"],
                delayq_dedup=os.environ["DEDUP"] == "1", delayq_dedup_url=os.environ["REDIS"],
                delayq_park=False, worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True)


def note(line):
    with open(os.environ["RUNS"], "a") as f:
        f.write(line + "\\n")


@app.task(base=DelayedRetryTask, bind=True, acks_late=True, max_retries=3)
def job(self):
    note(f"run {self.request.retries} {os.getpid()} {self.request.delivery_info.get('redelivered')}")
    if self.request.retries == 0:
        raise self.retry(countdown=0.5)
    return "ok"


@signals.message_scheduled.connect
def die_between_publish_and_ack(sender=None, plan=None, headers=None, **kw):
    note(f"scheduled {headers.get('retries')} {os.getpid()}")
    if os.environ.get("KILL") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # the retry is confirmed; the running message is not acked


@celery_signals.task_postrun.connect
def finished(sender=None, state=None, request=None, **kw):
    note(f"postrun {sender.request.retries} {state}")
'''


def _worker(tmp_path, env: dict, kill: bool):
    import os
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "killapp", "worker", "--pool", "solo", "-l", "warning",
         "--without-heartbeat", "--without-mingle", "--without-gossip"],
        cwd=tmp_path, env={**os.environ, **env, "KILL": "1" if kill else "0"},
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"worker{int(kill)}.log", "w"))


def _lines(path, prefix: str) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "dedup"])
def test_worker_killed_between_retry_publish_and_ack_retries_at_least_once(
        tmp_path, broker_url: str, prefix: str, uid: str, vhost: str, dedup: bool) -> None:
    import signal

    import amqp
    from celery import Celery

    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.rabbitmq.topology import Topology
    from retry_helpers import BROKER_HOST, REDIS_URL, redis_up

    if dedup and not redis_up():
        pytest.skip("Redis is not reachable")
    (tmp_path / "killapp.py").write_text(KILL_APP)
    runs = tmp_path / "runs.log"
    queue = f"kill.{uid}"
    env = {"BROKER": broker_url, "QUEUE": queue, "PREFIX": prefix, "DEDUP": "1" if dedup else "0",
           "REDIS": REDIS_URL, "RUNS": str(runs)}
    client = Celery("killclient", broker=broker_url, set_as_current=False)
    client.conf.update(task_default_queue=queue, broker_heartbeat=0)
    try:
        first = _worker(tmp_path, env, kill=True)
        client.send_task("killapp.job")
        assert first.wait(timeout=30) == -signal.SIGKILL, (tmp_path / "worker1.log").read_text()
        assert [r[:2] for r in _lines(runs, "run")] == [["run", "0"]]
        assert len(_lines(runs, "scheduled")) == 1  # the retry was published, then the worker died

        second = _worker(tmp_path, env, kill=False)
        try:
            deadline = time.time() + 30
            # Both retries (the killed worker's and the one the redelivery publishes) must arrive.
            while len([p for p in _lines(runs, "postrun") if p[1] == "1"]) < 2 and time.time() < deadline:
                time.sleep(0.1)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)
        retry_runs = [r for r in _lines(runs, "run") if r[1] == "1"]
        postruns = [p for p in _lines(runs, "postrun") if p[1] == "1"]
        redelivered = [r for r in _lines(runs, "run") if r[1] == "0" and r[3] == "True"]
        assert redelivered, "the unacked message was not redelivered to the second worker"
        assert len(postruns) == 2, f"expected both copies of the retry to arrive: {runs.read_text()}"
        assert len(retry_runs) >= 1, "the retry never ran"
        if dedup:
            assert len(retry_runs) == 1 and sorted(p[2] for p in postruns) == ["IGNORED", "SUCCESS"]
        else:
            assert len(retry_runs) == 2  # at least once: the duplicate runs too without the guard
    finally:
        conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
        conn.connect()
        exit_queue = Topology(LadderSpec(prefix=prefix), "quorum").destination("", queue).exit_queue
        for name in (queue, exit_queue):
            try:
                conn.channel().queue_delete(name)
            except Exception:
                pass
        conn.close()


def test_a_waiting_retry_lists_its_traceback_which_no_hop_carries(retry_app, collector) -> None:
    """The retry's traceback goes into its index entry (``pending``, the page's detail of a retry), never into
    the message: the retried run's headers have the one-line error and no traceback."""
    import celery_delayq

    app = retry_app()

    @app.task(base=DelayedRetryTask, bind=True, acks_late=True)
    def lookup(self):
        collector.add(retries=self.request.retries, error=self.request.get(H.LAST_ERROR),
                      trace_header=self.request.get(H.LAST_TRACEBACK))
        if self.request.retries == 0:
            _failing_lookup()  # raises KeyError inside a helper: the traceback names both frames
        return "ok"

    def _failing_lookup():
        try:
            {}["customer-42"]
        except KeyError as exc:
            raise lookup.retry(exc=exc, countdown=3)

    with running_worker(app):
        result = lookup.delay()
        collector.wait_for(1, timeout=20)
        deadline, waiting = time.time() + 10, []
        while time.time() < deadline and not waiting:
            waiting = celery_delayq.pending(app, task_id=result.id)
            time.sleep(0.1)
        assert result.get(timeout=20) == "ok"
    (retry,) = waiting
    assert retry.attempt == 1 and retry.last_error == "KeyError: 'customer-42'"
    assert retry.last_traceback and "_failing_lookup" in retry.last_traceback and retry.last_traceback.rstrip().endswith(
        "KeyError: 'customer-42'"), retry.last_traceback
    first, second = collector.items
    assert second["retries"] == 1 and second["error"] == "KeyError: 'customer-42'"
    assert first["trace_header"] is None and second["trace_header"] is None  # no hop carried it
