"""The AMQP client (py-amqp), named once for the layers above the edge (it is imported under ``rabbitmq/`` only).

:func:`connected` is how a reading command, the web page or the metrics endpoint opens the broker.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import kombu
import kombu.exceptions
import amqp.spec
from amqp import AccessRefused, Channel, Connection, Message, NotFound, PreconditionFailed
from amqp.exceptions import AMQPError, ConnectionError as AMQPConnectionError, RecoverableConnectionError

from ..errors import UnsupportedTransport

__all__ = ["attempts", "Connection", "Channel", "Message", "NotFound", "PreconditionFailed", "AccessRefused", "AMQPError",
           "RecoverableConnectionError", "CONNECTION_ERRORS", "raw_connection", "connected", "nack", "declare_queue",
           "broker_version", "throwaway_channel", "READ_SIDE_CONNECT_TIMEOUT_S"]

#: The least time a reading command, the page or the metrics endpoint gives the broker to accept a connection and
#: finish the AMQP handshake (s). Celery's ``broker_connection_timeout`` (4 s by default) is kept when longer. A
#: refused or unresolvable host still fails at once; a broker busy declaring and deleting quorum queues (RabbitMQ
#: 4.3 under a test suite took more than 4 s once) gets the time to answer instead of being called unreachable.
READ_SIDE_CONNECT_TIMEOUT_S = 15.0

#: Failures to reach or log in to the broker, whichever layer (socket, kombu, py-amqp) raises them.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (OSError, kombu.exceptions.OperationalError, AMQPConnectionError)


def raw_connection(connection: kombu.Connection, *, retries: int = 0) -> Connection:
    """``connection`` connected (every failover host once, then ``retries`` more rounds), as its py-amqp connection.

    Every host of a failover ``broker_url`` is tried, as the ladder's own connection does
    (:class:`~celery_delayq.rabbitmq.confirms.OwnedConnection`), not only the first (kombu's ``max_retries=0``).

    Raises:
        UnsupportedTransport: the broker transport is not AMQP 0-9-1 (RabbitMQ).
    """
    driver = connection.transport.driver_type
    if driver != "amqp":
        raise UnsupportedTransport(
            f"the delay ladder lives on RabbitMQ (AMQP 0-9-1), but the broker transport is "
            f"{driver!r}; use an amqp:// broker_url or set delayq_broker_url")
    connection.ensure_connection(max_retries=attempts(connection, retries) - 1)
    raw: Connection = connection.connection
    return raw


def attempts(connection: kombu.Connection, retries: int) -> int:
    """Connection attempts for one try of every failover host, then ``retries`` more rounds (pure).

    kombu switches host after each failed attempt and sleeps only when a round of the hosts is over.
    """
    return (retries + 1) * max(1, len(connection.alt or ()))


@contextlib.contextmanager
def connected(connection: kombu.Connection) -> Iterator[Connection]:
    """``connection`` connected (one attempt: an operator wants to know at once), as py-amqp's, released afterwards.

    The handshake may take up to :data:`READ_SIDE_CONNECT_TIMEOUT_S` (or the app's longer
    ``broker_connection_timeout``): a busy broker is slow, not unreachable.
    """
    connection.connect_timeout = max(connection.connect_timeout or 0.0,  # type: ignore[assignment]  # kombu: int
                                     READ_SIDE_CONNECT_TIMEOUT_S)
    try:
        yield raw_connection(connection)
    finally:
        with contextlib.suppress(Exception):
            connection.release()


def nack(channel: Channel, delivery_tag: int, *, multiple: bool = False) -> None:
    """``basic.nack`` with requeue (py-amqp has no method for it)."""
    channel.send_method(amqp.spec.Basic.Nack, "Lbb", (delivery_tag, multiple, True))


@contextlib.contextmanager
def throwaway_channel(raw: Connection) -> Iterator[Channel]:
    """A channel of its own for a few calls, closed afterwards (a refused declare or a 404 closes a channel:
    the probes and declares that may be refused each take one of these)."""
    ch = raw.channel()
    try:
        yield ch
    finally:
        with contextlib.suppress(Exception):
            ch.close()


def declare_queue(raw: Connection, queue: str, arguments: dict[str, object]) -> None:
    """Declare the durable ``queue`` on a throwaway channel."""
    with throwaway_channel(raw) as ch:
        ch.queue_declare(queue, durable=True, auto_delete=False, arguments=arguments)


def broker_version(connection: Connection) -> tuple[int, ...]:
    """RabbitMQ's version from the connection's server properties, e.g. ``(3, 10, 8)``."""
    raw = connection.server_properties.get("version", b"0")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or (0,)
