"""A ``delayq_management_url`` with ``user:password@`` is used with those credentials, and never printed.

Before, the credentials stayed in the URL: urllib read ``user:password@host``
as the host, every request failed, the API was reported unusable, and the
warning saying so printed the password. Now they are taken out of the URL
(:func:`~celery_delayq.rabbitmq.management.split_credentials`) and sent as
HTTP basic auth. Checked against the real management API of the test broker
(3.10 on 15672, 4.3 on 15673) with a user of the test's own, whose password
holds the characters a URL must percent-encode; the user is deleted after.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.parse
import urllib.request
import uuid
from typing import Any, Iterator

import kombu
import pytest
from helpers import management_url

from celery_delayq.config import DelayqConfig
from celery_delayq.rabbitmq import management
from celery_delayq.rabbitmq.management import ManagementAPI, split_credentials


def _admin(method: str, path: str, body: dict[str, Any] | None = None) -> None:
    """One management API call as the broker's administrator (guest), for the test's own set-up."""
    request = urllib.request.Request(management_url() + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10):
        pass


@pytest.fixture
def monitor(vhost: str) -> Iterator[tuple[str, str]]:
    """A ``monitoring`` user of the test's own with rights on the session vhost: (name, password)."""
    name, password = f"dqmon-{uuid.uuid4().hex[:8]}", f"p@ss:w/rd%{uuid.uuid4().hex[:6]}"
    q = urllib.parse.quote
    _admin("PUT", f"/api/users/{q(name, safe='')}", {"password": password, "tags": "monitoring"})
    try:
        _admin("PUT", f"/api/permissions/{q(vhost, safe='')}/{q(name, safe='')}",
               {"configure": "", "write": "", "read": ".*"})
        yield name, password
    finally:
        _admin("DELETE", f"/api/users/{q(name, safe='')}")


@pytest.fixture
def connection(broker_url: str) -> Iterator[kombu.Connection]:
    """A connected kombu connection to the test vhost (AMQP as guest)."""
    conn = kombu.Connection(broker_url)
    conn.ensure_connection(max_retries=1)
    yield conn
    conn.release()


def _with_credentials(user: str, password: str) -> str:
    host = management_url().split("://", 1)[1]
    return f"http://{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}@{host}"


@pytest.mark.parametrize("url,expected", [
    ("http://mon:s3cret@rabbit:15672/", ("http://rabbit:15672/", "mon", "s3cret")),
    ("https://mon:p%40ss%3Aw%2Frd@rabbit", ("https://rabbit", "mon", "p@ss:w/rd")),
    ("http://mon:p@ss@rabbit:15672", ("http://rabbit:15672", "mon", "p@ss")),
    ("http://mon@rabbit:15672", ("http://rabbit:15672", "mon", "")),
    ("http://rabbit:15672", ("http://rabbit:15672", None, None)),
])
def test_split_credentials(url: str, expected: tuple[str, str | None, str | None]) -> None:
    assert split_credentials(url) == expected


def test_the_password_is_not_in_the_apis_repr() -> None:
    api = ManagementAPI("http://rabbit:15672", "/", "mon", "hunter2secret")
    assert "hunter2secret" not in repr(api)


def test_credentials_in_the_url_are_the_ones_the_api_is_asked_with(
        connection: kombu.Connection, monitor: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    user, password = monitor
    url = _with_credentials(user, password)
    DelayqConfig(management_url=url)  # a valid setting
    with caplog.at_level(logging.DEBUG, logger="celery_delayq"):
        api = ManagementAPI.for_broker(connection, connection.connection, url)
        assert api is not None
        assert api.base_url == management_url() and (api.userid, api.password) == (user, password)
        assert api.identity().state == "ok"  # before: "unreachable", the URL was unusable
        assert api._get("/api/whoami")["name"] == user  # asked as the URL's user, not as AMQP's guest
        assert isinstance(api.queues(), list)
    assert password not in caplog.text and urllib.parse.quote(password, safe="") not in caplog.text


def test_without_credentials_in_the_url_the_amqp_ones_are_used(connection: kombu.Connection) -> None:
    api = ManagementAPI.for_broker(connection, connection.connection, management_url())
    assert api is not None and (api.userid, api.password) == ("guest", "guest")
    assert api._get("/api/whoami")["name"] == "guest"


def test_a_refused_password_is_warned_about_without_it(connection: kombu.Connection, monitor: tuple[str, str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    user, _ = monitor
    wrong = f"not-{uuid.uuid4().hex}"
    management._reported.clear()
    with caplog.at_level(logging.DEBUG, logger="celery_delayq"):
        api = ManagementAPI.for_broker(connection, connection.connection, _with_credentials(user, wrong))
        assert api is not None and api.identity().state == "unreachable"  # 401: cannot tell
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"not using the management API at {management_url()}:" in warnings[0]
    # It answered: the warning says so and names the user (it read "no answer from URL", a network hunt).
    assert f"it answered 401 for the user {user!r}" in warnings[0] and "no answer" not in warnings[0], warnings[0]
    assert wrong not in caplog.text


def test_an_unreachable_configured_url_is_warned_about_without_its_password(
        connection: kombu.Connection, caplog: pytest.LogCaptureFixture) -> None:
    """The worker's warning that printed ``user:password@`` verbatim."""
    management._reported.clear()
    with caplog.at_level(logging.DEBUG, logger="celery_delayq"):
        api = ManagementAPI.for_broker(connection, connection.connection, "http://mon:hunter2secret@127.0.0.1:9")
        assert api is not None and api.identity().state == "unreachable"
    assert "not using the management API at http://127.0.0.1:9: no answer from http://127.0.0.1:9" in caplog.text
    assert "hunter2secret" not in caplog.text
