"""Publisher confirms and mandatory returns on one AMQP channel, pipelined, and the dedicated connection that carries it.

A publish is scheduled only once confirmed *and* not returned (a return comes before its ack,
matched by the ladder entry id). Outcomes go to the :class:`Tracker` of the publish (one per
single publish or ``batch()`` block), never to the channel: no caller sees another's losses.

The channel lives on an :class:`OwnedConnection`: a dedicated connection owned by one process
(publisher, parker, index writer), a copy of the app's connection with every option but
``confirm_publish`` (with it py-amqp swallows confirms inside ``basic_publish``). Connecting tries
each host once, without sleeping, and raises :class:`~celery_delayq.errors.BrokerUnavailable`:
retrying is the caller's decision. A forked child forgets the parent's connection and opens its own.
Why :data:`USER_TIMEOUT_MS`: docs/clusters.md (measured details).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import amqp
from kombu.connection import Connection
from kombu.utils.url import maybe_sanitize_url

from ..errors import (BrokerUnavailable, PublishError, PublishNacked, PublishReturned, PublishTimeout,
                      UnsupportedTransport)
from ..ladder.headers import ENTRY

__all__ = ["ConfirmChannel", "Pending", "Tracker", "combine", "confirm_block", "fail", "message_name",
           "OwnedConnection", "dedicated_copy", "broker_urls", "NOT_INHERITED", "USER_TIMEOUT_MS"]


def message_name(message: amqp.Message, entry: str) -> str:
    """The name a caller knows a message by: Celery's task id, else ``message_id``, else ``entry``."""
    headers = message.application_headers or {}
    name = headers.get("id") or message.properties.get("message_id") or entry
    return str(name)


@dataclass(eq=False, slots=True)
class Tracker:
    """The publishes of one caller: ``outstanding`` (neither confirmed nor failed, wherever they are), ``failures``."""

    outstanding: int = 0
    failures: list[PublishError] = field(default_factory=list)

    def take_failures(self) -> list[PublishError]:
        """The failures recorded so far, cleared from the tracker."""
        out, self.failures = self.failures, []
        return out


@dataclass(eq=False, slots=True)
class Pending:
    """A published, not yet confirmed message (kept so it can be republished)."""

    entry: str
    message: amqp.Message
    exchange: str
    routing_key: str
    tracker: Tracker = field(default_factory=Tracker)
    #: Task id / message id / entry id, as in :attr:`PublishError.failed`.
    name: str = ""


class ConfirmChannel:
    """A confirm-mode channel that tracks every unconfirmed publish (not thread-safe: callers lock)."""

    def __init__(self, connection: amqp.Connection) -> None:
        self.connection = connection
        self.channel = connection.channel()
        self.channel.confirm_select()
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)
        self._next_tag = 1
        self.pending: dict[int, Pending] = {}
        self._returned: dict[str, str] = {}
        #: The tracker of publishes made without one (the parker's one-at-a-time use).
        self.tracker = Tracker()

    @property
    def failures(self) -> list[PublishError]:
        """Failures of publishes made without a tracker of their own."""
        return self.tracker.failures

    def publish(self, message: amqp.Message, exchange: str, routing_key: str,
                tracker: Tracker | None = None, *, name: str | None = None) -> int:
        """Send with ``mandatory`` set; returns the delivery tag (if this raises, the caller still owns it).

        ``name`` is what a failure calls the message (default: :func:`message_name`).
        """
        entry = message.application_headers.get(ENTRY, "")
        item = Pending(entry, message, exchange, routing_key, tracker or self.tracker,
                       name if name is not None else message_name(message, entry))
        tag = self._send(item)
        item.tracker.outstanding += 1
        return tag

    def adopt(self, item: Pending) -> int:
        """Republish a message left unconfirmed by a lost channel (its tracker already counts it)."""
        return self._send(item)

    def _send(self, item: Pending) -> int:
        self.channel.basic_publish(item.message, exchange=item.exchange, routing_key=item.routing_key, mandatory=True)
        tag = self._next_tag
        self._next_tag += 1
        self.pending[tag] = item
        return tag

    def wait(self, upto: int | None = None, *, timeout: float, keep: int = 0, tracker: Tracker | None = None) -> None:
        """Block until ``tracker``'s publishes are settled, else those up to tag ``upto`` (default all) but ``keep``.

        Raises:
            PublishTimeout: not confirmed within ``timeout`` s; names them (still tracked here).
        """
        def busy() -> bool:
            if tracker is not None:
                return tracker.outstanding > 0
            return (len(self.pending) if upto is None else sum(1 for _ in self._upto(upto))) > keep
        deadline = time.monotonic() + timeout
        while busy():
            left = deadline - time.monotonic()
            if left <= 0:
                late = [p for p in self.pending.values() if tracker is None or p.tracker is tracker]
                raise PublishTimeout(
                    f"no publisher confirm within {timeout:.1f} s for {len(late)} ladder message(s); they may or may "
                    "not be scheduled. Check the broker's health (memory/disk alarms block publishers).",
                    failed=[p.name for p in late], entries=[p.entry for p in late])
            try:
                self.connection.drain_events(timeout=left)
            except socket.timeout:
                continue

    def _upto(self, tag: int) -> Iterator[int]:
        """The unconfirmed tags up to ``tag`` (insertion order is tag order), without copying them."""
        return itertools.takewhile(lambda t: t <= tag, self.pending)

    def take_failures(self) -> list[PublishError]:
        """Failures of publishes made without a tracker, cleared from the channel."""
        return self.tracker.take_failures()

    def take(self) -> list[Pending]:
        """Every unconfirmed publish, in tag order, forgotten here to republish (still outstanding in trackers)."""
        out = list(self.pending.values())
        self.pending.clear()
        self._returned.clear()
        return out

    # -- broker callbacks ------------------------------------------------------
    def _settle(self, tag: int, multiple: bool, nacked: bool) -> None:
        for t in list(self._upto(tag)) if multiple else [tag]:  # a copy: the loop pops
            item = self.pending.pop(t, None)
            if item is None:
                continue
            item.tracker.outstanding -= 1
            reason = self._returned.pop(item.entry, None)
            if nacked:
                item.tracker.failures.append(PublishNacked(
                    f"the broker refused ladder message {item.name} (basic.nack), e.g. a ladder "
                    "queue at its length limit or a failing quorum; it was NOT scheduled",
                    failed=[item.name], entries=[item.entry]))
            elif reason is not None:
                item.tracker.failures.append(PublishReturned(
                    f"ladder message {item.name} was returned unroutable by exchange "
                    f"{item.exchange!r} ({reason}); the ladder topology is missing or differs. "
                    "It was NOT scheduled.", failed=[item.name], entries=[item.entry]))

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, nacked=False)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, nacked=True)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: amqp.Message) -> None:
        entry = (message.application_headers or {}).get(ENTRY, "")
        self._returned[entry] = str(getattr(exc, "reply_text", exc))


@contextlib.contextmanager
def confirm_block(local: threading.local, settle: Callable[[Tracker], None]) -> Iterator[None]:
    """A backend's ``confirming()`` block in this thread: its publishes share one :class:`Tracker`
    (``local.tracker``, which a publish joins), and ``settle`` awaits its confirms and raises what failed
    when the outermost block ends. A nested block joins the outer one."""
    if getattr(local, "tracker", None) is not None:
        yield
        return
    tracker = local.tracker = Tracker()
    try:
        yield
    finally:
        try:
            settle(tracker)
        finally:
            local.tracker = None


def fail(items: Iterable[Pending], error: Callable[[list[Pending]], PublishError]) -> None:
    """Settle ``items`` as not scheduled: each tracker gets one ``error(its items)``."""
    groups: dict[int, tuple[Tracker, list[Pending]]] = {}
    for item in items:
        groups.setdefault(id(item.tracker), (item.tracker, []))[1].append(item)
    for tracker, mine in groups.values():
        tracker.outstanding -= len(mine)
        tracker.failures.append(error(mine))


#: Names shown in an error message; ``PublishError.failed`` has all of them.
_SHOWN = 5


def combine(failures: Sequence[PublishError], *, also: Sequence[tuple[str, str]] = (),
            cause: PublishError | None = None) -> PublishError:
    """One error naming every message of ``failures`` plus ``also`` (``(name, entry)`` pairs).

    Its type is the failures' common type (``PublishError`` if they differ).
    """
    if len(failures) == 1 and not also and cause is None:
        return failures[0]
    names = [n for f in failures for n in f.failed] + [n for n, _ in also]
    entries = [e for f in failures for e in f.entries] + [e for _, e in also]
    if not names and cause is not None:
        return cause
    kinds = {type(f) for f in failures} | ({type(cause)} if cause is not None else set())
    cls = kinds.pop() if len(kinds) == 1 else PublishError
    first = str(cause if cause is not None else failures[0])
    shown = ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
    return cls(f"{first} -- {len(names)} delayed message(s) NOT scheduled or not confirmed: {shown}",
               failed=names, entries=entries)


# -- the dedicated connection ---------------------------------------------------------
#: This process's id, kept current across ``fork()``: read on every publish, and ``os.getpid()`` is a system call.
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


#: Transport options a dedicated confirm-mode connection must not take from the app's.
NOT_INHERITED = frozenset({"confirm_publish"})

#: ``TCP_USER_TIMEOUT`` of a dedicated connection (ms), where the user set none: as long as
#: the default confirm timeout, instead of py-amqp's 1 s (why: docs/clusters.md).
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
        if self._pid != _PID[0]:
            return None
        return self._confirm

    @property
    def raw(self) -> amqp.Connection:
        """The open py-amqp connection (call :meth:`open` first)."""
        if self._conn is None or self._pid != _PID[0]:
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
        self._conn, self._confirm, self._pid = conn, confirm, _PID[0]
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
        if self._conn is not None and self._pid == _PID[0]:
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
