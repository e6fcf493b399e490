"""The publisher under faults on the real broker: a connection dropped mid-batch, a reconnect
that fails, confirms that time out. Every message either arrives or is named (by task id) in
the PublishError, and nothing carries over into the next call."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import subprocess
import threading
import time
import uuid
from typing import Any, Iterator

import amqp
import kombu
import pytest

from celery_delayq.config import DelayqConfig
from celery_delayq.errors import BrokerUnavailable, PublishError, PublishTimeout
from celery_delayq.rabbitmq.confirms import ConfirmChannel
from celery_delayq.rabbitmq.publisher import LadderPublisher
from helpers import scheduler_of
from test_connection_options import BROKER_HOST, close_broker_connections


def arrived_ids(conn: amqp.Connection, queue: str, wanted: set[str], timeout: float) -> set[str]:
    """Task ids (``id`` header) consumed from ``queue`` until every id in ``wanted`` came, or ``timeout``.

    Then a short linger, so late duplicates and "may or may not" messages are counted too.
    """
    ch = conn.channel()
    seen: set[str] = set()

    def on(m: amqp.Message) -> None:
        seen.add(m.headers["id"])
        ch.basic_ack(m.delivery_tag)

    ch.basic_qos(0, 1000, False)
    tag = ch.basic_consume(queue, callback=on)
    deadline = time.time() + timeout
    linger_until = None
    while time.time() < (linger_until or deadline):
        if linger_until is None and wanted <= seen:
            linger_until = time.time() + 1.0
        try:
            conn.drain_events(timeout=0.5)
        except socket.timeout:
            pass
    with contextlib.suppress(Exception):
        ch.basic_cancel(tag)
    with contextlib.suppress(Exception):
        ch.close()
    return seen


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def own_vhost(vhost: str) -> Iterator[str]:
    """A vhost of this test's own (its permissions get revoked), deleted afterwards."""
    name = f"delayq-faults-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", name)
    _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            _ctl("delete_vhost", name)


def _url(vhost: str) -> str:
    from urllib.parse import quote

    return f"amqp://guest:guest@{BROKER_HOST}/{quote(vhost, safe='')}"


def _setup(vhost: str, uid: str, **config: Any) -> tuple[LadderPublisher, amqp.Connection, str, str]:
    """The publisher, a connection of the test's, the destination, and the name of the publisher's own
    connection (the index writer has one of its own beside it, which the drops leave alone)."""
    name = f"faults-{uid}"
    conn = kombu.Connection(_url(vhost), transport_options={"client_properties": {"connection_name": name}})
    pub = LadderPublisher(conn, DelayqConfig(**{"prefix": f"f{uid}", "levels": 8, **config}))
    raw = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    raw.connect()
    dest = f"dest.{uid}"
    raw.channel().queue_declare(dest, durable=True, auto_delete=False)
    pub.declare()
    return pub, raw, dest, f"{name} / celery_delayq ladder publisher"


class _BatchRun(threading.Thread):
    """Publishes ``n`` messages in one batch, slowly enough for a drop to land in the middle."""

    def __init__(self, pub: LadderPublisher, dest: str, ids: list[str], *, signal_at: int) -> None:
        super().__init__(daemon=True)
        self.pub, self.dest, self.ids = pub, dest, ids
        self.attempted: list[str] = []
        self.error: BaseException | None = None
        self.midway = threading.Event()
        #: Set by the test once the fault is in place; until then publishing slows down, so
        #: the fault lands mid-batch however slow ``rabbitmqctl`` is on a loaded machine.
        self.faulted = threading.Event()
        self.signal_at = signal_at

    def run(self) -> None:
        try:
            with scheduler_of(self.pub).batch():
                for i, tid in enumerate(self.ids):
                    self.attempted.append(tid)
                    scheduler_of(self.pub).schedule_body(i, delay=0.05 + (i % 20) / 100, queue=self.dest, headers={"id": tid})
                    if i == self.signal_at:
                        self.midway.set()
                    time.sleep(0.002 if i < self.signal_at or self.faulted.is_set() else 0.02)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc
        finally:
            self.midway.set()


def _check_all_arrived_or_named(run: _BatchRun, raw: amqp.Connection, dest: str) -> set[str]:
    failed = set(run.error.failed) if isinstance(run.error, PublishError) else set()
    if run.error is not None:
        assert isinstance(run.error, PublishError), repr(run.error)  # never a bare AssertionError
        assert failed <= set(run.attempted)
    attempted = set(run.attempted)
    seen = arrived_ids(raw, dest, attempted - failed, timeout=30)
    missing = attempted - seen - failed
    assert not missing, f"{len(missing)} message(s) neither arrived nor named: {sorted(missing)[:5]}"
    return failed


def test_connection_dropped_mid_batch_every_message_arrives_or_is_named(own_vhost: str, uid: str) -> None:
    pub, raw, dest, name = _setup(own_vhost, uid)
    try:
        ids = [f"task-{uid}-{i}" for i in range(1000)]
        run = _BatchRun(pub, dest, ids, signal_at=100)
        run.start()
        assert run.midway.wait(30)
        closed = close_broker_connections(name)
        at_close = len(run.attempted)
        run.faulted.set()
        run.join(120)
        assert not run.is_alive()
        assert closed == 1 and at_close < len(ids), (closed, at_close)  # the drop did land mid-batch
        _check_all_arrived_or_named(run, raw, dest)

        # the next batch starts clean: no error, nothing named from before, all delivered
        nxt = [f"next-{uid}-{i}" for i in range(20)]
        with scheduler_of(pub).batch():
            for i, tid in enumerate(nxt):
                scheduler_of(pub).schedule_body(i, delay=0.05, queue=dest, headers={"id": tid})
        assert set(nxt) <= arrived_ids(raw, dest, set(nxt), timeout=15)
    finally:
        pub.close()
        raw.close()


def test_failed_reconnect_names_every_unconfirmed_message(own_vhost: str, uid: str) -> None:
    pub, raw, dest, name = _setup(own_vhost, uid)
    try:
        ids = [f"task-{uid}-{i}" for i in range(1000)]
        run = _BatchRun(pub, dest, ids, signal_at=100)
        run.start()
        assert run.midway.wait(30)
        _ctl("clear_permissions", "-p", own_vhost, "guest")  # so the reconnect is refused
        try:
            assert close_broker_connections(name) == 1
            at_close = len(run.attempted)
            run.faulted.set()
            run.join(120)
        finally:
            _ctl("set_permissions", "-p", own_vhost, "guest", ".*", ".*", ".*")
        assert not run.is_alive()
        assert at_close < len(ids), at_close  # the drop did land mid-batch
        assert isinstance(run.error, BrokerUnavailable), repr(run.error)
        assert len(run.attempted) < len(ids)  # it stopped at the failure
        failed = _check_all_arrived_or_named(run, raw, dest)
        assert run.attempted[-1] in failed  # the publish that found the failure is named too
        assert len(run.error.entries) == len(run.error.failed)

        nxt = [f"next-{uid}-{i}" for i in range(20)]
        with scheduler_of(pub).batch():
            for i, tid in enumerate(nxt):
                scheduler_of(pub).schedule_body(i, delay=0.05, queue=dest, headers={"id": tid})
        assert set(nxt) <= arrived_ids(raw, dest, set(nxt), timeout=15)
    finally:
        pub.close()
        raw.close()


def test_single_publish_after_a_drop_reconnects_and_republishes(own_vhost: str, uid: str) -> None:
    pub, raw, dest, name = _setup(own_vhost, uid)
    try:
        scheduler_of(pub).schedule_body("a", delay=0.05, queue=dest, headers={"id": f"a-{uid}"})
        assert close_broker_connections(name) == 1
        time.sleep(0.5)  # let the close reach the client socket
        scheduler_of(pub).schedule_body("b", delay=0.05, queue=dest, headers={"id": f"b-{uid}"})
        want = {f"a-{uid}", f"b-{uid}"}
        assert want <= arrived_ids(raw, dest, want, timeout=15)
    finally:
        pub.close()
        raw.close()


def test_a_drop_between_a_single_publish_and_its_confirm_republishes_it_once_and_returns(
        own_vhost: str, uid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pub, raw, dest, name = _setup(own_vhost, uid)
    try:
        scheduler_of(pub).schedule_body("warm", delay=0.05, queue=dest, headers={"id": f"warm-{uid}"})
        calls: dict[str, list[str]] = {"publish": [], "adopt": [], "drop": []}
        real_publish, real_adopt, real_wait = ConfirmChannel.publish, ConfirmChannel.adopt, ConfirmChannel.wait

        def publish(self: ConfirmChannel, message: amqp.Message, *args: Any, **kwargs: Any) -> int:
            calls["publish"].append(message.application_headers["id"])
            return real_publish(self, message, *args, **kwargs)

        def adopt(self: ConfirmChannel, item: Any) -> int:
            calls["adopt"].append(item.name)
            return real_adopt(self, item)

        def wait(self: ConfirmChannel, *args: Any, **kwargs: Any) -> None:
            if not calls["drop"]:  # sent, its confirm not read yet: the connection breaks now
                calls["drop"].append(name)
                self.connection.transport.sock.shutdown(socket.SHUT_RDWR)
            real_wait(self, *args, **kwargs)

        monkeypatch.setattr(ConfirmChannel, "publish", publish)
        monkeypatch.setattr(ConfirmChannel, "adopt", adopt)
        monkeypatch.setattr(ConfirmChannel, "wait", wait)
        tid = f"one-{uid}"
        assert scheduler_of(pub).schedule_body("one", delay=0.05, queue=dest, headers={"id": tid}) is not None
        # Sent once by the caller, republished once on the new connection, never sent again by the retry
        # (it may arrive twice: the broker may have taken the first copy; at least once, never lost).
        assert calls == {"publish": [tid], "adopt": [tid], "drop": [name]}
        assert tid in arrived_ids(raw, dest, {tid}, timeout=15)
    finally:
        pub.close()
        raw.close()


def test_a_timed_out_single_publish_names_it_once(own_vhost: str, uid: str) -> None:
    pub, raw, dest, _ = _setup(own_vhost, uid, confirm_timeout=1e-9)
    try:
        tid = f"late-{uid}"
        with pytest.raises(PublishTimeout) as err:
            scheduler_of(pub).schedule_body("late", delay=0.05, queue=dest, headers={"id": tid})
        assert err.value.failed == [tid] and len(err.value.entries) == 1
        assert "may or may not" in str(err.value)
    finally:
        pub.close()
        raw.close()


def test_timed_out_batch_names_task_ids_and_leaks_nothing_into_the_next(own_vhost: str, uid: str) -> None:
    # A confirm timeout too short for any broker: an exit wait with anything open times out at once.
    pub, raw, dest, _ = _setup(own_vhost, uid, confirm_timeout=1e-9)
    try:
        first = [f"first-{uid}-{i}" for i in range(50)]
        with pytest.raises(PublishTimeout) as err:
            with scheduler_of(pub).batch():
                for i, tid in enumerate(first):
                    scheduler_of(pub).schedule_body(i, delay=0.05, queue=dest, headers={"id": tid})
        # py-amqp reads confirms before each publish, so the last ones are what is still open
        assert first[-1] in err.value.failed and set(err.value.failed) <= set(first)
        assert "may or may not" in str(err.value)

        second = [f"second-{uid}-{i}" for i in range(10)]
        with pytest.raises(PublishTimeout) as err2:
            with scheduler_of(pub).batch():
                for i, tid in enumerate(second):
                    scheduler_of(pub).schedule_body(i, delay=0.05, queue=dest, headers={"id": tid})
        assert second[-1] in err2.value.failed
        assert set(err2.value.failed) <= set(second)  # nothing of the first batch

        pub.config = dataclasses.replace(pub.config, confirm_timeout=30)
        third = [f"third-{uid}-{i}" for i in range(10)]
        with scheduler_of(pub).batch():
            for i, tid in enumerate(third):
                scheduler_of(pub).schedule_body(i, delay=0.05, queue=dest, headers={"id": tid})
        assert scheduler_of(pub).schedule_body("single", delay=0.05, queue=dest, headers={"id": f"single-{uid}"})
        want = set(third) | {f"single-{uid}"}
        assert want <= arrived_ids(raw, dest, want, timeout=15)
    finally:
        pub.close()
        raw.close()


def test_a_batch_that_raised_inside_still_waits_and_names_nothing_twice(own_vhost: str, uid: str) -> None:
    pub, raw, dest, _ = _setup(own_vhost, uid)
    try:
        ids = [f"t-{uid}-{i}" for i in range(30)]
        with pytest.raises(KeyError):  # the caller's own error wins when every publish was confirmed
            with scheduler_of(pub).batch():
                for i, tid in enumerate(ids):
                    scheduler_of(pub).schedule_body(i, delay=0.05, queue=dest, headers={"id": tid})
                raise KeyError("caller")
        assert set(ids) <= arrived_ids(raw, dest, set(ids), timeout=15)
    finally:
        pub.close()
        raw.close()
