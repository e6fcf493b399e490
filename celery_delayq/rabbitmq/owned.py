"""A dedicated broker connection with one confirm channel, owned by one process (publisher, parker).

A copy of the app's connection with every option but ``confirm_publish`` (with it py-amqp
swallows confirms inside ``basic_publish``). Connecting tries each host once, without sleeping,
and raises :class:`~celery_delayq.errors.BrokerUnavailable`: retrying is the caller's decision.
A forked child forgets the parent's connection and opens its own.

py-amqp sets ``TCP_USER_TIMEOUT`` to 1 s (py-amqp #114), so a broker that stops reading for a
second kills the connection mid-frame: a publisher of 20 kB messages died after 2 s of a 3 s
SIGSTOP of 3.10.8, and lost nothing with 30 s. Hence :data:`USER_TIMEOUT_MS`, unless set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Any

import amqp
from kombu.connection import Connection
from kombu.utils.url import maybe_sanitize_url

from .confirms import ConfirmChannel
from ..errors import BrokerUnavailable, UnsupportedTransport

__all__ = ["OwnedConnection", "dedicated_copy", "broker_urls", "NOT_INHERITED", "USER_TIMEOUT_MS"]

log = logging.getLogger(__name__)

#: Transport options a dedicated confirm-mode connection must not take from the app's.
NOT_INHERITED = frozenset({"confirm_publish"})

#: ``TCP_USER_TIMEOUT`` of a dedicated connection (ms), where the user set none: as long as
#: the default confirm timeout, instead of py-amqp's 1 s (see the module docstring).
USER_TIMEOUT_MS = 30_000
#: The socket option's number (Linux); py-amqp uses 18 where ``socket`` lacks the name.
_TCP_USER_TIMEOUT: int = getattr(socket, "TCP_USER_TIMEOUT", 18)


def dedicated_copy(template: Connection, role: str) -> Connection:
    """A not yet connected copy of ``template`` for a confirm channel of our own (pure).

    Every option but :data:`NOT_INHERITED`, :data:`USER_TIMEOUT_MS` unless ``socket_settings`` set
    one, and a ``connection_name`` operators can tell apart.
    """
    options = {k: v for k, v in (template.transport_options or {}).items() if k not in NOT_INHERITED}
    sockopts = dict(options.get("socket_settings") or {})
    sockopts.setdefault(_TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
    options["socket_settings"] = sockopts
    props = dict(options.get("client_properties") or {})
    theirs = props.get("connection_name")
    ours = f"celery_delayq {role} (pid {os.getpid()})"
    props["connection_name"] = f"{theirs} / {ours}" if theirs else ours
    options["client_properties"] = props
    copy: Connection = template.clone(transport_options=options)
    return copy


def broker_urls(conn: Connection) -> str:
    """The broker URL(s) of ``conn`` for a message: every failover host, passwords masked."""
    if len(conn.alt or ()) > 1:
        return ", ".join(str(maybe_sanitize_url(u)) if isinstance(u, str) else repr(u) for u in conn.alt)
    return str(conn.as_uri())


class OwnedConnection:
    """One process's dedicated connection and confirm channel, opened on demand.

    Not thread-safe: the holder serialises calls with its own lock.
    """

    def __init__(self, template: Connection, *, role: str) -> None:
        self.template = template
        self.role = role
        self._conn: Connection | None = None
        self._confirm: ConfirmChannel | None = None
        self._pid = 0
        self._used = 0.0

    @property
    def confirm(self) -> ConfirmChannel | None:
        """The confirm channel, if this process has one open (else ``None``)."""
        if self._pid != os.getpid():
            return None
        return self._confirm

    @property
    def raw(self) -> amqp.Connection:
        """The open py-amqp connection (call :meth:`open` first)."""
        if self._conn is None or self._pid != os.getpid():
            raise RuntimeError(f"the {self.role} connection is not open in this process")
        raw: amqp.Connection = self._conn.connection
        return raw

    def open(self) -> ConfirmChannel:
        """Connect (dropping any previous connection) and open the confirm channel.

        Raises:
            BrokerUnavailable: no broker host accepted the connection (one try each).
            UnsupportedTransport: the broker is not RabbitMQ over py-amqp.
        """
        self.drop()
        conn = dedicated_copy(self.template, self.role)
        if conn.transport.driver_type != "amqp":
            raise UnsupportedTransport(
                f"the delay ladder needs RabbitMQ (AMQP 0-9-1); broker transport is "
                f"{conn.transport.driver_type!r}. Use an amqp:// or pyamqp:// broker URL.")
        hosts = max(1, len(conn.alt or ()))
        try:
            conn.ensure_connection(max_retries=hosts - 1, interval_start=0, interval_step=0,
                                   interval_max=0, reraise_as_library_errors=False)
            raw = conn.connection
            if not isinstance(raw, amqp.Connection):
                raise UnsupportedTransport("the delay ladder needs kombu's 'pyamqp' transport (py-amqp)")
            confirm = ConfirmChannel(raw)
        except UnsupportedTransport:
            with contextlib.suppress(Exception):
                conn.release()
            raise
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.release()
            raise BrokerUnavailable(
                f"cannot connect to the broker at {broker_urls(self.template)} "
                f"({type(exc).__name__}: {exc}). Check that RabbitMQ is running and reachable, "
                "and the URL, credentials, virtual host and TLS settings.") from exc
        self._conn, self._confirm, self._pid = conn, confirm, os.getpid()
        self._used = time.monotonic()
        return confirm

    def idle_too_long(self) -> bool:
        """Unused for over a heartbeat interval (nobody sent heartbeats): safer to reconnect."""
        conn = self._conn
        if conn is None:
            return False
        heartbeat = getattr(conn.connection, "heartbeat", 0) or 0
        return bool(heartbeat) and time.monotonic() - self._used > heartbeat

    def touch(self) -> None:
        """Note a use (see :meth:`idle_too_long`)."""
        self._used = time.monotonic()

    def drop(self) -> None:
        """Close the connection if this process opened it; forget it either way."""
        if self._conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._conn.release()
        self._conn = None
        self._confirm = None

    def after_fork_in_child(self) -> None:
        """In a forked child: never touch the parent's socket; reconnect on next use."""
        self._conn = None
        self._confirm = None

    def describe(self) -> dict[str, Any]:
        """The options the dedicated connection is opened with (for diagnostics and tests)."""
        conn = dedicated_copy(self.template, self.role)
        return {"url": broker_urls(conn), "ssl": conn.ssl, "login_method": conn.login_method,
                "heartbeat": conn.heartbeat, "connect_timeout": conn.connect_timeout,
                "transport_options": dict(conn.transport_options or {})}
