"""``delayq_enabled`` turns the ladder on whichever way Celery is configured; bad delays fail first.

Every configuration path Celery offers (``conf.update``, ``config_from_object``,
``config_source``, ``add_defaults`` before and after the configuration is
loaded, Celery's ``TestApp`` and its pytest plugin's ``celery_config``) must
install the ladder, and :func:`celery_delayq.is_installed` must say so before
anything has read ``app.conf``. Each app then publishes a real delayed task,
which must arrive through the ladder.

With the ladder on, a plain task's bad ``countdown`` or ``eta`` is the
package's ``InvalidDelay`` (as for ``DelayedRetryTask``), raised before
Celery publishes anything: ``before_task_publish`` is never sent and nothing
reaches the destination queue or the ladder.
"""

from __future__ import annotations

import contextlib
import math
import types
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import amqp
import pytest
from celery import Celery, signals as celery_signals
from celery.contrib.testing.app import TestApp

import celery_delayq
from celery_delayq import signals
from helpers import drain, queue_depth

pytestmark = pytest.mark.timeout(120)


def _settings(broker_url: str, prefix: str, queue: str) -> dict[str, Any]:
    return {"broker_url": broker_url, "delayq_enabled": True, "delayq_prefix": prefix,
            "task_default_queue": queue, "broker_heartbeat": 0}


def _conf_update(s: dict[str, Any]) -> Celery:
    app = Celery("act", set_as_current=False)
    app.conf.update(s)
    return app


def _config_from_object(s: dict[str, Any]) -> Celery:
    app = Celery("act", set_as_current=False)
    app.config_from_object(types.SimpleNamespace(**s))
    return app


def _config_source(s: dict[str, Any]) -> Celery:
    return Celery("act", set_as_current=False, config_source=types.SimpleNamespace(**s))


def _add_defaults_before_load(s: dict[str, Any]) -> Celery:
    app = Celery("act", set_as_current=False)
    app.add_defaults(s)
    return app


def _add_defaults_after_load(s: dict[str, Any]) -> Celery:
    app = Celery("act", set_as_current=False)
    assert app.conf.task_serializer  # the configuration is loaded now
    app.add_defaults(s)
    return app


def _conf_update_after_load(s: dict[str, Any]) -> Celery:
    app = Celery("act", set_as_current=False)
    assert app.conf.task_serializer  # the configuration is loaded now
    app.conf.update(s)
    return app


def _test_app(s: dict[str, Any]) -> Celery:
    app: Celery = TestApp(config=s)  # how Celery's own test helpers build an app
    return app


def noop() -> None:
    """The task body of every test here."""


PATHS: dict[str, Callable[[dict[str, Any]], Celery]] = {
    "conf.update": _conf_update, "config_from_object": _config_from_object, "config_source": _config_source,
    "add_defaults before load": _add_defaults_before_load, "add_defaults after load": _add_defaults_after_load,
    "conf.update after load": _conf_update_after_load, "TestApp": _test_app,
}


@pytest.fixture
def queue(uid: str, amqp_conn: amqp.Connection) -> Iterator[str]:
    name = f"act.{uid}"
    ch = amqp_conn.channel()
    ch.queue_declare(name, durable=True, auto_delete=False)
    yield name
    with contextlib.suppress(Exception):
        ch.queue_delete(name)


@pytest.fixture
def apps(make_app: Any) -> Iterator[list[Celery]]:
    """Apps a test built; uninstalled after (``make_app`` closes the ladder publishers)."""
    made: list[Celery] = []
    yield made
    for app in made:
        celery_delayq.uninstall(app)


def _delayed_publish_goes_through_the_ladder(app: Celery, amqp_conn: amqp.Connection, queue: str, uid: str) -> None:
    task = app.task(name=f"act.{uid}", shared=False)(noop)
    result = task.apply_async(countdown=0.5)
    (m,) = drain(amqp_conn, queue, 1, timeout=20)
    assert m.headers["id"] == result.id
    assert "x-delayq-entry" in m.headers, f"the delayed publish skipped the ladder: {m.headers}"
    assert m.arrived >= float(m.headers["x-delayq-due"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", list(PATHS))
def test_every_configuration_path_turns_the_ladder_on(
        path: str, broker_url: str, prefix: str, queue: str, uid: str, amqp_conn: amqp.Connection,
        apps: list[Celery]) -> None:
    app = PATHS[path](_settings(broker_url, prefix, queue))
    apps.append(app)
    assert celery_delayq.is_installed(app), f"{path}: the ladder is not on"
    _delayed_publish_goes_through_the_ladder(app, amqp_conn, queue, uid)


@pytest.mark.parametrize("path", ["conf.update", "config_from_object", "TestApp"])
def test_a_kombu_publisher_whose_first_call_is_producer_or_acquire_goes_through_the_ladder(
        path: str, broker_url: str, prefix: str, queue: str, amqp_conn: amqp.Connection, apps: list[Celery]) -> None:
    """Celery before 5.6 loads the configuration inside ``producer_pool`` and then sets its own pool over
    the ladder's: the first kombu-level delayed publish of such a process skipped the ladder (Celery 5.3, 5.5)."""
    app = PATHS[path](_settings(broker_url, prefix, queue))
    apps.append(app)
    assert not app.configured  # the producer is the first thing to read the configuration
    with app.producer_or_acquire() as producer:
        producer.publish({"n": 1}, routing_key=queue, headers={"x-delay": 300}, serializer="json")
    (m,) = drain(amqp_conn, queue, 1, timeout=20)
    assert "x-delayq-entry" in m.headers, f"the first delayed publish skipped the ladder: {m.headers}"
    assert m.arrived >= float(m.headers["x-delayq-due"])  # type: ignore[attr-defined]


def test_is_installed_reads_the_configuration_it_needs(broker_url: str, prefix: str, queue: str,
                                                       apps: list[Celery]) -> None:
    on = _conf_update(_settings(broker_url, prefix, queue))
    off = Celery("off", set_as_current=False, broker=broker_url)
    apps += [on, off]
    assert not on.configured  # nothing has read app.conf yet
    assert celery_delayq.is_installed(on)
    assert not celery_delayq.is_installed(off)


def test_a_setting_added_after_the_ladder_read_the_settings_is_seen(
        broker_url: str, prefix: str, queue: str, uid: str, amqp_conn: amqp.Connection, apps: list[Celery]) -> None:
    settings = _settings(broker_url, prefix, queue)
    del settings["delayq_enabled"]
    app = _conf_update(settings)
    apps.append(app)
    ladder = celery_delayq.install(app)  # as a DelayedRetryTask does when it is bound
    assert not ladder.config.enabled  # read now, with the setting still off
    app.add_defaults({"delayq_enabled": True})
    assert ladder.config.enabled
    _delayed_publish_goes_through_the_ladder(app, amqp_conn, queue, uid)


# -- Celery's pytest plugin: a user's test suite configures its app through celery_config --
@pytest.fixture
def celery_config(broker_url: str, prefix: str, queue: str) -> dict[str, Any]:
    return _settings(broker_url, prefix, queue)


def test_the_pytest_plugins_celery_config_turns_the_ladder_on(
        celery_app: Celery, queue: str, uid: str, amqp_conn: amqp.Connection, apps: list[Celery]) -> None:
    apps.append(celery_app)
    assert celery_delayq.is_installed(celery_app)
    _delayed_publish_goes_through_the_ladder(celery_app, amqp_conn, queue, uid)


# -- bad input on plain tasks ------------------------------------------------------------
BAD: dict[str, dict[str, Any]] = {
    "countdown='soon'": {"countdown": "soon"},
    "countdown='5'": {"countdown": "5"},
    "countdown=nan": {"countdown": math.nan},
    "countdown=inf": {"countdown": math.inf},
    "countdown=-inf": {"countdown": -math.inf},
    "countdown=-1e300": {"countdown": -1e300},
    "countdown=True": {"countdown": True},
    "eta=object()": {"eta": object()},
    "eta='tomorrow'": {"eta": "tomorrow"},
    "eta=[1, 2]": {"eta": [1, 2]},
    "eta=nan": {"eta": math.nan},
}


@pytest.mark.parametrize("how", ["apply_async", "send_task"])
def test_a_bad_delay_on_a_plain_task_is_invalid_delay_and_nothing_is_sent(
        how: str, broker_url: str, prefix: str, queue: str, uid: str, amqp_conn: amqp.Connection,
        apps: list[Celery]) -> None:
    app = _conf_update(_settings(broker_url, prefix, queue))
    apps.append(app)
    task = app.task(name=f"plain.{uid}", shared=False)(noop)
    sent: list[Any] = []

    def on_publish(**kwargs: Any) -> None:
        sent.append(kwargs.get("headers"))

    celery_signals.before_task_publish.connect(on_publish, weak=False)
    signals.before_schedule.connect(on_publish, weak=False)
    try:
        for name, options in BAD.items():
            with pytest.raises(celery_delayq.InvalidDelay):
                if how == "apply_async":
                    task.apply_async(**options)
                else:
                    app.send_task(task.name, **options)
            assert not sent, f"{name}: something was published: {sent}"
        # The same app still publishes a good delay, and an eta given as epoch seconds is one.
        due = datetime.now(timezone.utc).timestamp() + 0.5
        good = task.apply_async(eta=due) if how == "apply_async" else app.send_task(task.name, eta=due)
        (m,) = drain(amqp_conn, queue, 1, timeout=20)
        assert m.headers["id"] == good.id and "x-delayq-entry" in m.headers
    finally:
        celery_signals.before_task_publish.disconnect(on_publish)
        signals.before_schedule.disconnect(on_publish)
    assert queue_depth(amqp_conn, queue) == 0


def test_a_too_long_delay_on_a_plain_task_fails_before_anything_is_sent(
        broker_url: str, prefix: str, queue: str, uid: str, apps: list[Celery]) -> None:
    app = _conf_update(dict(_settings(broker_url, prefix, queue), delayq_max_delay=60))
    apps.append(app)
    task = app.task(name=f"plain.{uid}", shared=False)(noop)
    sent: list[Any] = []

    def on_publish(**kwargs: Any) -> None:
        sent.append(kwargs)

    celery_signals.before_task_publish.connect(on_publish, weak=False)
    try:
        with pytest.raises(celery_delayq.DelayTooLong):
            task.apply_async(countdown=3600)
    finally:
        celery_signals.before_task_publish.disconnect(on_publish)
    assert not sent
