"""Whether a management API speaks for the AMQP connection's broker (3.10 and 4.3 on the shared broker).

The three signs of :meth:`ManagementAPI.identify` are each checked on the real
broker, by giving the API an AMQP identity that only one sign can match. The
API on another node of a cluster, and another broker's API, are in
``tests/cluster/test_cluster_management.py``.
"""

from __future__ import annotations

import logging
import time

import amqp
import pytest
from helpers import management_url

from celery_delayq.rabbitmq import management
from celery_delayq.rabbitmq.management import ManagementAPI, amqp_identity, default_name_of


def _api(amqp_conn: amqp.Connection, vhost: str, *, cluster_name: str | None,
         connection_name: str | None) -> ManagementAPI:
    return ManagementAPI(management_url(), vhost, "guest", "guest", cluster_name=cluster_name,
                         connection_name=connection_name, configured=True)


def test_the_amqp_connection_names_its_cluster_and_itself(amqp_conn: amqp.Connection) -> None:
    cluster, name = amqp_identity(amqp_conn)
    local, peer = amqp_conn.sock.getsockname(), amqp_conn.sock.getpeername()
    assert cluster  # RabbitMQ always sends one (a node-derived default when never set)
    assert name == f"{local[0]}:{local[1]} -> {peer[0]}:{peer[1]}"


def test_the_same_cluster_name_identifies_the_broker(amqp_conn: amqp.Connection, vhost: str) -> None:
    cluster, name = amqp_identity(amqp_conn)
    found = _api(amqp_conn, vhost, cluster_name=cluster, connection_name=None).identify()
    assert (found.state, found.how) == ("ok", "cluster_name")


def test_the_connection_itself_shows_among_the_apis_connections(amqp_conn: amqp.Connection, vhost: str) -> None:
    """The third sign (for an API of several nodes, where names differ per node): the connection is listed."""
    _, name = amqp_identity(amqp_conn)
    api = _api(amqp_conn, vhost, cluster_name="elsewhere@nowhere", connection_name=name)
    assert api._sees_connection(name, wait_s=10) is True  # after the node's next statistics emission
    assert api._sees_connection("10.9.9.9:1 -> 10.9.9.9:2", wait_s=1) is False


def test_a_single_node_with_another_name_is_another_broker_at_once(amqp_conn: amqp.Connection, vhost: str) -> None:
    """One node gives AMQP and HTTP the same cluster_name: a differing one is another broker, no waiting."""
    _, name = amqp_identity(amqp_conn)
    started = time.monotonic()
    found = _api(amqp_conn, vhost, cluster_name="elsewhere@nowhere", connection_name=name).identify(wait_s=6)
    assert found.state == "other_broker" and time.monotonic() - started < 2


def test_an_unknown_cluster_and_connection_is_another_broker(amqp_conn: amqp.Connection, vhost: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    api = _api(amqp_conn, vhost, cluster_name="elsewhere@nowhere", connection_name="10.9.9.9:1 -> 10.9.9.9:2")
    management._reported.clear()
    with caplog.at_level(logging.INFO, logger="celery_delayq.rabbitmq.management"):
        assert api.same_broker is False
        assert api.queues() is None and api.routes("amq.direct", "x") is None  # nothing answers for it
        assert api.same_broker is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]  # once, not per call
    text = warnings[0].getMessage()
    assert "elsewhere@nowhere" in text and "delayq_management_url" in text and "leader placement" in text
    assert api.identity().state == "other_broker"


def test_a_configured_api_that_does_not_answer_is_reported_once_at_warning(
        amqp_conn: amqp.Connection, caplog: pytest.LogCaptureFixture) -> None:
    api = ManagementAPI("http://127.0.0.1:9", "/", "guest", "guest", timeout=0.5, cluster_name="x@y",
                        configured=True)
    management._reported.clear()
    with caplog.at_level(logging.INFO, logger="celery_delayq.rabbitmq.management"):
        assert api.same_broker is False and api.same_broker is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "delayq_management_url" in warnings[0], warnings


def test_a_node_derived_cluster_name_is_matched_to_its_node() -> None:
    nodes = ["rabbit@db1", "rabbit@db2", "rabbit@db3"]
    assert default_name_of("rabbit@db2.example.com", nodes)  # 3.x default: <name>@<FQDN>
    assert default_name_of("rabbit@db2", nodes)
    assert not default_name_of("rabbit@db4.example.com", nodes)
    assert not default_name_of("rabbit@db22.example.com", nodes)
    assert not default_name_of("other@db2.example.com", nodes)
    assert not default_name_of("my-cluster", nodes)  # a name set with set_cluster_name names no node
    # Nodes named @localhost report the machine's name: matched through the API's own node.
    local = ["n1@localhost", "n2@localhost"]
    assert default_name_of("n2@vm", local, api_node="n1@localhost", api_cluster="n1@vm")
    assert not default_name_of("n2@vm", local, api_node="n1@localhost", api_cluster="n1@other")
    assert not default_name_of("n2@vm", local)
