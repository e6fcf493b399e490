"""Delays longer than the ladder make laps through it (real broker, real worker).

A scaled-down ladder (3 levels of radix 4, unit 10 ms: 0.63 s at most)
makes a 2.5 s countdown cross the ladder's boundary three times in seconds,
exactly as a 10-year delay crosses the default 31-day ladder.
"""

from __future__ import annotations

import time

import pytest

from celery_delayq import DelayTooLong
from celery_delayq.ladder.spec import LadderSpec
from helpers import entity_exists, running_worker

pytestmark = pytest.mark.timeout(90)

SMALL = {"delayq_levels": 3, "delayq_unit_ms": 10, "delayq_radix": 4}


@pytest.fixture
def small_prefix(uid: str, amqp_conn):
    prefix = f"lap{uid}"
    yield prefix
    from celery_delayq.rabbitmq.topology import Topology

    from celery_delayq.ladder.index_layout import IndexLayout

    spec = LadderSpec(prefix=prefix, levels=3, unit_ms=10, radix=4)
    topo = Topology(spec, "quorum", index=IndexLayout(spec))  # the index and cancel streams go too
    laps_exit = topo.destination("", topo.spec.laps_queue).exit_queue
    existed = entity_exists(amqp_conn, "queue", laps_exit)
    deleted = topo.delete(amqp_conn, if_empty=False)
    assert (f"queue {laps_exit}" in deleted) == existed  # the laps queue's own exit queue goes with the ladder
    assert not entity_exists(amqp_conn, "queue", laps_exit)


def test_a_delay_longer_than_the_ladder_laps_and_is_never_early(make_app, collector, small_prefix: str) -> None:
    app = make_app(delayq_enabled=True, delayq_prefix=small_prefix, **SMALL)
    spec = LadderSpec(prefix=small_prefix, levels=3, unit_ms=10, radix=4)
    assert spec.max_delay_s == pytest.approx(0.63)

    @app.task(bind=True)
    def remind(self, sent: float) -> None:
        collector.add(ran=time.time(), sent=sent, due=float(self.request.get("x-delayq-due")),
                      laps=self.request.get("x-delayq-laps"))

    with running_worker(app):
        sent = time.time()
        remind.apply_async((sent,), countdown=2.5)
        remind.apply_async((sent,), countdown=0.3)  # fits: no lap
        runs = sorted(collector.wait_for(2, timeout=30), key=lambda r: r["ran"])
    short, long = runs
    assert short["laps"] is None
    assert long["laps"] == 3  # 0.63 s at a time, three times, then the remaining ~0.6 s fits
    assert long["ran"] >= long["due"] >= sent + 2.5 - 0.01
    assert long["ran"] - long["due"] < 1.0, f"{long['ran'] - long['due']:.3f} s late after 3 laps"


def test_delayq_max_delay_still_caps_delays(make_app, small_prefix: str) -> None:
    app = make_app(delayq_enabled=True, delayq_prefix=small_prefix, delayq_max_delay=1.0, **SMALL)

    @app.task
    def remind() -> None: ...

    with pytest.raises(DelayTooLong, match="delayq_max_delay"):
        remind.apply_async(countdown=2)


def test_ten_years_is_accepted_by_the_default_ladder(make_app, amqp_conn) -> None:
    app = make_app(delayq_enabled=True)

    @app.task
    def renew() -> None: ...

    scheduled = []
    from celery_delayq import signals

    def seen(sender=None, plan=None, headers=None, **_):
        scheduled.append((plan, dict(headers)))

    signals.before_schedule.connect(seen, weak=False)
    try:
        renew.apply_async(countdown=10 * 365 * 86400)
    finally:
        signals.before_schedule.disconnect(seen)
    (plan, headers), = scheduled
    assert plan.destination.routing_key.endswith(".laps") and headers["x-delayq-laps"] == 1
    assert plan.units == LadderSpec().max_units
    ch = amqp_conn.channel()
    try:  # take it out again: nobody wants to wait ten years in the test vhost
        ch.queue_purge(plan.destination.exit_queue)
    finally:
        ch.close()
