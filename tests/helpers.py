"""Test helpers shared by every test directory (import as ``from helpers import ...``).

Import shared names from here, never ``from conftest import``: with a
``conftest.py`` in a subdirectory too (``tests/cli``), the module Python finds
as ``conftest`` depends on which one pytest imported last.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any, Callable, Hashable, Iterator

import amqp

__all__ = ["BROKER_HOST", "management_url", "broker_up", "Collector", "running_worker", "queue_depth", "drain",
           "delete_ladder"]

#: ``host:port`` of the RabbitMQ the tests use (``./dev test --rmq4`` sets 127.0.0.1:5673).
BROKER_HOST = os.environ.get("DELAYQ_TEST_BROKER_HOST", "127.0.0.1:5672")


def management_url() -> str:
    """This broker's management API: AMQP port + 10000 (15672 for 5672, 15673 for the 4.3 node)."""
    host, _, port = BROKER_HOST.partition(":")
    return f"http://{host}:{int(port or 5672) + 10000}"


def broker_up() -> bool:
    """Does the test broker accept an AMQP connection?"""
    try:
        c = amqp.Connection(BROKER_HOST, connect_timeout=3)
        c.connect()
        c.close()
        return True
    except Exception:
        return False


class Collector:
    """Thread-safe record of task runs, with a deterministic wait (no fixed sleeps)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def add(self, **item: Any) -> None:
        item.setdefault("at", time.time())
        with self._cond:
            self.items.append(item)
            self._cond.notify_all()

    def wait_for(self, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        with self._cond:
            while len(self.items) < n:
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError(f"only {len(self.items)} of {n} task runs within {timeout} s: {self.items[-3:]}")
                self._cond.wait(left)
            return list(self.items)

    def __len__(self) -> int:
        return len(self.items)


@contextlib.contextmanager
def running_worker(app: Any, **kwargs: Any) -> Iterator[Any]:
    """A real Celery worker in a thread (solo pool), consuming the app's queues."""
    from celery.contrib.testing.worker import start_worker

    kwargs.setdefault("pool", "solo")
    kwargs.setdefault("perform_ping_check", False)
    kwargs.setdefault("shutdown_timeout", 20)
    kwargs.setdefault("loglevel", "WARNING")
    with start_worker(app, **kwargs) as worker:
        yield worker


def entity_exists(conn: amqp.Connection, kind: str, name: str) -> bool:
    """Whether a queue or exchange exists (the package's passive-declare probes)."""
    from celery_delayq.rabbitmq.probe import exchange_exists, queue_exists

    return queue_exists(conn, name) if kind == "queue" else exchange_exists(conn, name)


def queue_depth(conn: amqp.Connection, name: str) -> int:
    """Ready messages in a queue (passive declare)."""
    ch = conn.channel()
    try:
        return ch.queue_declare(name, passive=True).message_count
    finally:
        with contextlib.suppress(Exception):
            ch.close()


def drain(conn: amqp.Connection, queue: str, n: int, timeout: float = 30.0,
          key: Callable[[amqp.Message], Hashable] | None = None) -> list[amqp.Message]:
    """Consume messages from ``queue`` (acked) until ``n`` have arrived, failing after ``timeout``.

    With ``key``, ``n`` counts *distinct* keys: quorum queues dead-letter
    at-least-once, so a redelivered duplicate must not stand in for a message
    that is still missing. Every message consumed is returned, duplicates too.
    """
    ch = conn.channel()
    got: list[amqp.Message] = []
    seen: set[Hashable] = set()

    def on(m: amqp.Message) -> None:
        m.arrived = time.time()  # type: ignore[attr-defined]
        got.append(m)
        seen.add(key(m) if key is not None else len(got))
        ch.basic_ack(m.delivery_tag)

    ch.basic_qos(0, 1000, False)
    tag = ch.basic_consume(queue, callback=on)
    deadline = time.time() + timeout
    while len(seen) < n:
        left = deadline - time.time()
        if left <= 0:
            break
        try:
            conn.drain_events(timeout=min(left, 1.0))
        except socket.timeout:
            pass
    with contextlib.suppress(Exception):
        ch.basic_cancel(tag)
    with contextlib.suppress(Exception):
        ch.close()
    assert len(seen) == n, (f"{len(seen)} of {n} distinct messages arrived in {queue} within {timeout} s "
                            f"({len(got)} consumed in all)")
    return got


def delete_ladder(conn: amqp.Connection, spec: Any, *, exit_queues: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Delete a ladder a test made: levels, exchanges, laps, unroutable, its index and cancel streams, its
    parking queue and ``exit_queues``, messages or not (a ``Topology`` built without an index would leave
    the 17 streams behind)."""
    from celery_delayq.ladder.index_layout import IndexLayout
    from celery_delayq.rabbitmq.topology import Topology

    topo = Topology(spec, "quorum", index=IndexLayout(spec))
    deleted = topo.delete(conn, if_empty=False, exit_queues=[*exit_queues, f"{spec.prefix}.parking"])
    return deleted


def scheduler_of(publisher: Any) -> Any:
    """The one place above a ladder publisher (delay check, signals, index, ``batch()``), for tests
    that drive a publisher of their own (``Scheduler.for_connection`` builds the process's)."""
    from celery_delayq.index.writer import index_writer_for
    from celery_delayq.scheduling import Scheduler

    return Scheduler(publisher.config, publisher, index=index_writer_for(publisher.template, publisher.config),
                     clock=publisher.clock)
