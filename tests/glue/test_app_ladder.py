"""``AppLadder.divert``: the one question the producer asks. Pure: no broker."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from hypothesis import given, strategies as st
from kombu import Exchange, Queue

from celery_delayq.ladder import headers as H
from celery_delayq.glue.app_ladder import AppLadder, native_unwrap
from celery_delayq.config import DelayqConfig
from celery_delayq.errors import DelayTooLong, InvalidDelay, InvalidName
from celery_delayq.rabbitmq.management import key_matches

NOW = 1_800_000_000.0


def ladder(enabled: bool = True, **conf: Any) -> AppLadder:
    app = Celery("t", broker="amqp://127.0.0.1:1//", set_as_current=False)
    return AppLadder(app, DelayqConfig(enabled=enabled, **conf), clock=lambda: NOW)


def eta(seconds: float) -> str:
    return datetime.fromtimestamp(NOW + seconds, tz=timezone.utc).isoformat()


def test_undelayed_publish_is_left_alone() -> None:
    assert ladder().divert({"task": "t", "id": "1"}, "", "q", ()) is None


def test_delayed_publish_goes_where_an_undelayed_one_would() -> None:
    q = Queue("work", Exchange("work", "direct"), routing_key="work")
    d = ladder().divert({"task": "t", "eta": eta(30)}, Exchange("work", "direct"), "work", [q])
    assert d is not None
    assert (d.exchange, d.routing_key, d.queue_hint) == ("work", "work", "work")
    assert d.due == pytest.approx(NOW + 30) and d.delay == pytest.approx(30)


def test_only_ladder_tasks_when_the_switch_is_off() -> None:
    off = ladder(enabled=False)
    headers = {"task": "plain", "eta": eta(30), H.DUE: NOW + 30, H.ENTRY: "old"}
    assert off.divert(headers, "", "q", ()) is None
    assert H.ENTRY not in headers and H.DUE not in headers  # a copied pass is forgotten
    off.tasks.add("mine")
    assert off.divert({"task": "mine", "eta": eta(30)}, "", "q", ()) is not None


def test_past_eta_runs_now_and_forgets_the_previous_pass() -> None:
    headers = {"task": "t", "eta": eta(-5), H.DUE: NOW - 5, H.HOPS: 3}
    assert ladder().divert(headers, "", "q", ()) is None
    assert H.DUE not in headers and H.HOPS not in headers


def test_due_header_alone_is_a_delay_and_sets_celerys_eta() -> None:
    headers = {"task": "t", H.DUE: NOW + 12}
    d = ladder().divert(headers, "", "q", ())
    assert d is not None and d.due == NOW + 12
    assert datetime.fromisoformat(headers["eta"]).timestamp() == pytest.approx(NOW + 12)


def test_a_too_long_delay_fails_in_the_scheduler_before_any_broker_call() -> None:
    """divert() leaves the length to the one check above the backends (celery_delayq.scheduling)."""
    long = ladder(max_delay=30 * 86400)
    assert long.divert({"task": "t", "eta": eta(40 * 86400)}, "", "q", ()) is not None
    with pytest.raises(DelayTooLong, match="delayq_max_delay"):
        long.scheduler.schedule(b"", due=NOW + 40 * 86400, delay=40 * 86400, exchange="", routing_key="q",
                                headers={"task": "t"})
    with pytest.raises(DelayTooLong, match="never truncates"):
        ladder().scheduler.schedule(b"", due=NOW + 10**12, delay=10**12, exchange="", routing_key="q",
                                    headers={"task": "t"})
    assert long.publisher.topology is None  # the broker (here: none at all) was never asked


def test_bad_input_fails_before_any_broker_call() -> None:
    with pytest.raises(InvalidDelay):
        ladder().divert({"task": "t", "eta": "tomorrow"}, "", "q", ())
    assert ladder().divert({"task": "t", "eta": eta(40 * 86400)}, "", "q", ()) is not None  # laps
    with pytest.raises(InvalidName, match="queue name|routing key"):
        ladder().divert({"task": "t", "eta": eta(5)}, "", "q" * 300, [Queue("q" * 300)])
    with pytest.raises(InvalidName, match="queue name"):
        ladder().divert({"task": "t", "eta": eta(5)}, "celery", "k", [Queue("q" * 300, routing_key="k")])
    with pytest.raises(InvalidName, match="exchange name"):
        ladder().divert({"task": "t", "eta": eta(5)}, "x" * 256, "k", ())


def test_queue_hint_only_when_the_declared_queue_receives_the_publish() -> None:
    q = Queue("celery", Exchange("celery", "direct"), routing_key="celery")
    lad = ladder()
    assert lad.divert({"task": "t", "eta": eta(5)}, "", "celery", [q]).queue_hint == "celery"  # type: ignore[union-attr]
    assert lad.divert({"task": "t", "eta": eta(5)}, "celery", "celery", [q]).queue_hint == "celery"  # type: ignore[union-attr]
    # apply_async(exchange=..., routing_key=...) still declares the default queue: not the receiver
    assert lad.divert({"task": "t", "eta": eta(5)}, "other", "nothing", [q]).queue_hint is None  # type: ignore[union-attr]
    topic = Queue("t", Exchange("events", "topic"), routing_key="order.*")
    assert lad.divert({"task": "t", "eta": eta(5)}, "events", "order.paid", [topic]).queue_hint == "t"  # type: ignore[union-attr]


def test_queue_default_delay_applies_to_undelayed_publishes_only() -> None:
    lad = ladder(enabled=False, queue_delays={"slow": 30})
    lad._queue_delays = {"slow": 30.0}
    d = lad.divert({"task": "any"}, "", "slow", ())
    assert d is not None and d.due == NOW + 30
    assert lad.divert({"task": "any"}, "", "fast", ()) is None


def test_native_ladder_publish_is_unwrapped() -> None:
    key = ".".join(["0"] * 27 + ["1"]) + ".work"
    assert native_unwrap("celery_delayed_27", key) == ("celery_delayed_delivery", "work")
    assert native_unwrap("celery", key) is None
    d = ladder().divert({"task": "t", "eta": eta(-1)}, "celery_delayed_27", key, ())
    assert d is not None and d.due is None and d.exchange == "celery_delayed_delivery"


@given(st.floats(min_value=0.001, max_value=30 * 86400, allow_nan=False))
def test_never_scheduled_before_its_eta(seconds: float) -> None:
    d = ladder().divert({"task": "t", "eta": eta(seconds)}, "", "q", ())
    assert d is not None and d.due is not None
    assert d.due >= datetime.fromisoformat(eta(seconds)).timestamp() - 1e-6


@pytest.mark.parametrize("kind,binding,key,expected", [
    ("direct", "a", "a", True), ("direct", "a", "b", False), ("fanout", "", "x", True),
    ("topic", "a.*", "a.b", True), ("topic", "a.*", "a.b.c", False), ("topic", "a.#", "a", True),
    ("topic", "#.z", "x.y.z", True), ("topic", "*.b.#", "a.b", True), ("headers", "", "x", None),
])
def test_binding_key_matching(kind: str, binding: str, key: str, expected: bool | None) -> None:
    assert key_matches(kind, binding, key) is expected


def test_timedelta_countdown_equivalence() -> None:
    d = ladder().divert({"task": "t", "eta": (datetime.fromtimestamp(NOW, tz=timezone.utc)
                                              + timedelta(seconds=90)).isoformat()}, "", "q", ())
    assert d is not None and d.delay == pytest.approx(90)


def test_an_app_and_its_ladder_are_collected_together() -> None:
    """A process that builds many apps (a test suite, a multi-tenant service) does not keep them all."""
    import gc
    import weakref

    from celery import Celery

    from celery_delayq import ladder_for

    app = Celery("short_lived", broker="amqp://guest:guest@127.0.0.1:5672//", set_as_current=False)
    ladder = ladder_for(app)
    assert ladder_for(app) is ladder and ladder.app is app
    gone_app, gone_ladder = weakref.ref(app), weakref.ref(ladder)
    del app, ladder
    gc.collect()
    assert gone_app() is None and gone_ladder() is None
