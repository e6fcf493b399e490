"""The ladder's own connection keeps the user's connection options, except ``confirm_publish``.

Checked on the real broker: what the broker reports for the ladder's
connection (``rabbitmqctl list_connections``: negotiated heartbeat, auth
mechanism, connection name), and what happens with TLS options against a
plain listener and with a stopped broker.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid
from typing import Any

import amqp
import kombu
import pytest
from kombu.exceptions import OperationalError

import celery_delayq
from celery_delayq.config import DelayqConfig
from celery_delayq.errors import BrokerUnavailable, PublishError
from celery_delayq.rabbitmq.confirms import USER_TIMEOUT_MS, dedicated_copy
from celery_delayq.rabbitmq.publisher import LadderPublisher
from helpers import Collector, drain, running_worker, scheduler_of

BROKER_HOST = os.environ.get("DELAYQ_TEST_BROKER_HOST", "127.0.0.1:5672")


def broker_connections(name_part: str) -> list[dict[str, Any]]:
    """The broker's view of every client connection whose ``connection_name`` contains ``name_part``."""
    out = subprocess.run(
        ["rabbitmqctl", "list_connections", "-q", "--no-table-headers",
         "pid", "timeout", "auth_mechanism", "ssl", "client_properties"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and name_part in parts[4]:
            rows.append({"pid": parts[0], "heartbeat": int(parts[1]), "auth_mechanism": parts[2],
                         "ssl": parts[3], "client_properties": parts[4]})
    return rows


def close_broker_connections(name_part: str) -> int:
    """Close (broker side, like an operator would) every connection named with ``name_part``."""
    rows = broker_connections(name_part)
    for row in rows:
        subprocess.run(["rabbitmqctl", "-q", "close_connection", row["pid"], "test: dropped on purpose"],
                       check=True, capture_output=True, timeout=60)
    return len(rows)


@pytest.fixture
def dest(amqp_conn: amqp.Connection, uid: str) -> str:
    name = f"dest.{uid}"
    amqp_conn.channel().queue_declare(name, durable=True, auto_delete=False)
    return name


@pytest.fixture
def make_publisher(prefix: str):
    made: list[LadderPublisher] = []

    def factory(connection: kombu.Connection, **config: Any) -> LadderPublisher:
        pub = LadderPublisher(connection, DelayqConfig(prefix=prefix, **config))
        made.append(pub)
        return pub

    yield factory
    for pub in made:
        pub.close()


def _named(uid: str) -> dict[str, Any]:
    return {"client_properties": {"connection_name": f"t-{uid}"}}


# -- pure: what the dedicated connection is opened with ------------------------------------
def test_dedicated_copy_keeps_options_but_never_confirm_publish() -> None:
    tls = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": "/etc/ca.pem"}
    template = kombu.Connection("amqp://u:secret@h1:5671/vh;amqp://u:secret@h2:5671/vh", ssl=tls,
                                login_method="AMQPLAIN", heartbeat=10, connect_timeout=3,
                                transport_options={"confirm_publish": True, "read_timeout": 7,
                                                   "client_properties": {"connection_name": "web-1"}})
    copy = dedicated_copy(template, "ladder publisher")
    assert "confirm_publish" not in copy.transport_options
    assert copy.transport_options["read_timeout"] == 7
    assert copy.transport_options["client_properties"]["connection_name"].startswith("web-1 / celery_delayq")
    assert copy.ssl == tls and copy.login_method == "AMQPLAIN" and copy.heartbeat == 10
    assert copy.connect_timeout == 3 and copy.virtual_host == "vh" and copy.userid == "u"
    assert copy.password == "secret" and len(copy.alt) == 2  # failover hosts kept
    assert template.transport_options["confirm_publish"] is True  # the app's own is untouched
    assert copy.transport_options["socket_settings"] == {socket.TCP_USER_TIMEOUT: USER_TIMEOUT_MS}


def test_dedicated_copy_keeps_the_users_tcp_user_timeout() -> None:
    template = kombu.Connection("amqp://h", transport_options={
        "socket_settings": {socket.TCP_USER_TIMEOUT: 5000, socket.TCP_KEEPIDLE: 30}})
    assert dedicated_copy(template, "x").transport_options["socket_settings"] == {
        socket.TCP_USER_TIMEOUT: 5000, socket.TCP_KEEPIDLE: 30}


# -- a broker that stops reading for a while -------------------------------------------------
def _broker_os_pid() -> int:
    out = subprocess.run(["rabbitmqctl", "eval", "list_to_integer(os:getpid())."], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return int(out.strip().splitlines()[-1])


def test_a_broker_that_stops_reading_for_3_s_loses_no_publish(broker_url, make_publisher, amqp_conn,
                                                              dest, uid, caplog) -> None:
    """py-amqp's 1 s TCP_USER_TIMEOUT killed the ladder connection mid-burst (seen in CI: 8 bursting
    publishers on 2 cores); the dedicated connection waits as long as the confirm timeout."""
    pid = _broker_os_pid()
    pub = make_publisher(kombu.Connection(broker_url, transport_options=_named(uid)))
    scheduler_of(pub).schedule_body("warm-up", delay=0.05, queue=dest)
    raw = pub.raw_connection()
    assert raw.transport.sock.getsockopt(socket.SOL_TCP, socket.TCP_USER_TIMEOUT) == USER_TIMEOUT_MS
    body = "x" * 20_000
    sent = 0
    os.kill(pid, signal.SIGSTOP)
    resumer = threading.Timer(3.0, os.kill, (pid, signal.SIGCONT))
    resumer.start()
    try:
        with scheduler_of(pub).batch():
            start = time.time()
            while time.time() - start < 5:  # the socket buffers fill within the pause
                scheduler_of(pub).schedule_body(body, delay=0.05, queue=dest, headers={"id": f"{uid}-{sent}"})
                sent += 1
    finally:
        resumer.join()
        os.kill(pid, signal.SIGCONT)
    assert sent > 100
    assert "connection lost" not in caplog.text  # no reconnect, so no republished duplicates
    assert len(drain(amqp_conn, dest, sent + 1, timeout=60)) == sent + 1


# -- confirm_publish ------------------------------------------------------------------------
def test_confirm_publish_in_transport_options_still_schedules(broker_url, make_publisher, amqp_conn, dest, uid) -> None:
    options = {"confirm_publish": True, **_named(uid)}
    pub = make_publisher(kombu.Connection(broker_url, transport_options=options), confirm_timeout=5)
    start = time.time()
    sched = scheduler_of(pub).schedule_body("x", delay=0.1, queue=dest, headers={"id": f"task-{uid}"})
    assert sched is not None and time.time() - start < 3  # not a confirm timeout
    with scheduler_of(pub).batch():
        for i in range(50):
            scheduler_of(pub).schedule_body(i, delay=0.1, queue=dest)
    assert len(drain(amqp_conn, dest, 51, timeout=15)) >= 51
    assert "confirm_publish" not in pub.link.describe()["transport_options"]


def test_celery_app_with_confirm_publish_runs_delayed_task(make_app, collector: Collector) -> None:
    app = make_app(broker_transport_options={"confirm_publish": True}, delayq_confirm_timeout=5)

    @app.task
    def probe(due: float) -> None:
        collector.add(due=due)

    celery_delayq.install(app)
    with running_worker(app):
        start = time.time()
        probe.apply_async((time.time() + 0.5,), countdown=0.5)
        probe.apply_async((time.time() + 1.0,), countdown=1.0)
        runs = collector.wait_for(2, timeout=20)
    assert all(r["at"] >= r["due"] for r in runs)
    assert time.time() - start < 10


# -- heartbeat, login_method -----------------------------------------------------------------
def test_heartbeat_is_negotiated_and_an_idle_connection_is_replaced(broker_url, make_publisher, amqp_conn,
                                                                    dest, uid) -> None:
    pub = make_publisher(kombu.Connection(broker_url, heartbeat=2, transport_options=_named(uid)))
    assert scheduler_of(pub).schedule_body("first", delay=0.05, queue=dest) is not None
    rows = broker_connections(f"t-{uid}")
    assert [r["heartbeat"] for r in rows] == [2], rows
    time.sleep(5.5)  # well past two heartbeat intervals with nobody sending on it
    assert scheduler_of(pub).schedule_body("second", delay=0.05, queue=dest) is not None
    assert sorted(str(m.body) for m in drain(amqp_conn, dest, 2, timeout=10)) == ['"first"', '"second"']


@pytest.mark.parametrize("method", ["AMQPLAIN", "PLAIN"])
def test_login_method_is_passed_through(broker_url, make_publisher, dest, uid, method) -> None:
    pub = make_publisher(kombu.Connection(broker_url, login_method=method, transport_options=_named(uid)))
    assert scheduler_of(pub).schedule_body("x", delay=0.05, queue=dest) is not None
    rows = broker_connections(f"t-{uid}")
    assert [r["auth_mechanism"] for r in rows] == [method], rows


# -- TLS: passed through, and a failure is loud -----------------------------------------------
def _plain_port_url(broker_url: str) -> str:
    return broker_url.replace("guest:guest@", "guest:s3cret@")  # a password that must never show


def test_ssl_against_a_plain_listener_fails_loudly_naming_the_url(broker_url, make_publisher, dest, uid) -> None:
    pub = make_publisher(kombu.Connection(_plain_port_url(broker_url), ssl=True, connect_timeout=5))
    assert pub.link.describe()["ssl"] is True
    with pytest.raises(BrokerUnavailable) as err:
        scheduler_of(pub).schedule_body("x", delay=1, queue=dest, headers={"id": f"task-{uid}"})
    msg = str(err.value)
    assert BROKER_HOST in msg and "s3cret" not in msg, msg
    assert "SSL" in msg or "ssl" in msg, msg
    assert err.value.failed == [f"task-{uid}"]


def test_ssl_options_reach_the_dedicated_connection(broker_url, make_publisher, dest) -> None:
    missing = f"/nonexistent/{uuid.uuid4().hex}/ca.pem"
    options = {"ca_certs": missing, "cert_reqs": ssl.CERT_REQUIRED}
    pub = make_publisher(kombu.Connection(broker_url, ssl=options, connect_timeout=5))
    assert pub.link.describe()["ssl"] == options
    with pytest.raises(BrokerUnavailable, match="ca.pem|No such file"):
        scheduler_of(pub).schedule_body("x", delay=1, queue=dest)


# -- a stopped broker -----------------------------------------------------------------------
CLOSED = "amqp://guest:s3cret@127.0.0.1:1//"


def test_stopped_broker_fails_fast_and_names_url_cause_and_message(make_publisher, uid) -> None:
    pub = make_publisher(kombu.Connection(CLOSED))
    start = time.monotonic()
    with pytest.raises(BrokerUnavailable) as err:
        scheduler_of(pub).schedule_body("x", delay=5, queue="q", headers={"id": f"task-{uid}"})
    took = time.monotonic() - start
    assert took < 2.0, f"took {took:.2f} s"
    msg = str(err.value)
    assert "127.0.0.1:1" in msg and "s3cret" not in msg and "refused" in msg.lower(), msg
    assert err.value.failed == [f"task-{uid}"]
    assert isinstance(err.value, PublishError) and isinstance(err.value, OperationalError)
    # batches name every message too, and nothing lingers for the next call
    with pytest.raises(BrokerUnavailable) as err2:
        with scheduler_of(pub).batch():
            scheduler_of(pub).schedule_body("y", delay=5, queue="q", headers={"id": f"second-{uid}"})
    assert err2.value.failed == [f"second-{uid}"]


def test_stopped_broker_apply_async_fails_fast(make_app, uid) -> None:
    app = make_app()
    app.conf.broker_url = CLOSED
    app.conf.delayq_enabled = True

    @app.task
    def probe() -> None: ...

    celery_delayq.install(app)
    start = time.monotonic()
    with pytest.raises(OperationalError) as err:
        probe.apply_async(countdown=5, task_id=f"task-{uid}")
    took = time.monotonic() - start
    assert took < 2.0, f"took {took:.2f} s"
    assert "s3cret" not in str(err.value)


def test_every_failover_host_is_tried_before_an_operators_connection_gives_up() -> None:
    """``cancel``, ``pending``, the parking queue and the CLI connect through these two: with the first
    node of a failover ``broker_url`` down, the next host serves (the chaos soak saw them fail instead)."""
    from celery_delayq.index.stream import reader_connection
    from celery_delayq.rabbitmq.client import attempts, raw_connection

    dead = []
    for _ in range(2):  # two ports nothing listens on
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead.append(s.getsockname()[1])
    url = ";".join([f"amqp://guest:guest@127.0.0.1:{p}//" for p in dead] + [f"amqp://guest:guest@{BROKER_HOST}//"])
    assert attempts(kombu.Connection(url), 0) == 3 and attempts(kombu.Connection(url), 1) == 6
    assert attempts(kombu.Connection(f"amqp://guest:guest@{BROKER_HOST}//"), 0) == 1
    conn = kombu.Connection(url)
    started = time.monotonic()
    try:
        assert raw_connection(conn).connected
    finally:
        conn.release()
    with reader_connection(kombu.Connection(url)) as raw:
        assert raw.connected
    assert time.monotonic() - started < 5.0  # no sleep between the hosts of one round
    with pytest.raises(OperationalError):  # and a list of dead hosts still fails, after one try each
        raw_connection(kombu.Connection(";".join(f"amqp://guest:guest@127.0.0.1:{p}//" for p in dead)))
