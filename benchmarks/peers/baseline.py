"""The machine's own limits (issue item 7), shaped as a peer so they run side by side.

* ``raw_pipelined``          - py-amqp, durable messages into ONE quorum queue, publisher
  confirms with a window of 500 in flight: the broker's pipelined-confirm ceiling.
* ``raw_confirm_each``       - the same, waiting for each confirm: the round-trip ceiling of
  any "wait for my own confirm" API.
* ``send_task_unconfirmed``  - Celery's own ``send_task`` with no delay and no confirms
  (Celery's default): the reference for the apply_async target.
* ``send_task_confirmed``    - Celery's own ``send_task`` with ``confirm_publish`` into a quorum
  queue: Celery's cost plus one confirm round trip, measured rather than composed (the
  reference for ``apply_async`` confirm-each).

These messages are never consumed for lateness; their "due" is irrelevant.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import amqp

from .apps import QUEUES, make_app
from .base import Peer, Publisher, raw_body

RAW_QUEUE = "dqbench.raw"


class BaselinePeer(Peer):
    """Reference publishers that bound what any delayed publish can reach."""

    name = "baseline"
    title = "Machine limits"
    modes = ("raw_pipelined", "raw_confirm_each", "send_task_unconfirmed", "send_task_confirmed")

    def __init__(self, url: str, **opts: Any) -> None:
        super().__init__(url, **opts)
        self.window = int(opts.get("window", 500))
        self._apps: dict[bool, Any] = {}

    @property
    def dest_queue(self) -> str:
        return RAW_QUEUE

    def _raw_conn(self) -> amqp.Connection:
        from urllib.parse import unquote, urlparse

        u = urlparse(self.url)
        conn = amqp.Connection(f"{u.hostname}:{u.port or 5672}", userid=u.username or "guest",
                               password=u.password or "guest", virtual_host=unquote(u.path[1:]) or "/",
                               heartbeat=0)
        conn.connect()
        return conn

    def declare(self) -> None:
        conn = self._raw_conn()
        ch = conn.channel()
        ch.queue_declare(RAW_QUEUE, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
        ch.queue_declare(QUEUES["plain"], durable=True, auto_delete=False)
        ch.queue_declare(QUEUES["plain_quorum"], durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
        conn.close()

    def publisher(self, mode: str) -> Publisher:
        if mode == "raw_pipelined":
            return _RawPublisher(self._raw_conn(), self.window)
        if mode == "raw_confirm_each":
            return _RawPublisher(self._raw_conn(), 1)
        if mode in ("send_task_unconfirmed", "send_task_confirmed"):
            confirm = mode == "send_task_confirmed"
            if confirm not in self._apps:
                self._apps[confirm], _ = make_app("plain_quorum" if confirm else "plain", self.url, confirm=confirm)
            return _SendTask(self._apps[confirm])
        raise ValueError(f"unknown baseline mode {mode!r}")

    def queues(self) -> list[str]:
        return [RAW_QUEUE, QUEUES["plain"], QUEUES["plain_quorum"]]



class _RawPublisher(Publisher):
    """Pipelined publisher confirms with a fixed window (window 1 = confirm each)."""

    def __init__(self, conn: amqp.Connection, window: int) -> None:
        self.conn, self.window = conn, window
        self.ch = conn.channel()
        self.ch.confirm_select()
        self.sent = 0
        self.acked = 0
        self.nacked = 0
        self.ch.events["basic_ack"].add(self._on_ack)
        self.ch.events["basic_nack"].add(self._on_nack)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self.acked = max(self.acked, tag)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self.acked = max(self.acked, tag)
        self.nacked += 1

    def send(self, due: float, seq: int) -> None:
        self.ch.basic_publish(amqp.Message(raw_body(due, seq), delivery_mode=2), exchange="",
                              routing_key=RAW_QUEUE)
        self.sent += 1
        while self.sent - self.acked >= self.window:
            self.conn.drain_events(timeout=30)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        yield
        while self.acked < self.sent:
            self.conn.drain_events(timeout=30)
        if self.nacked:
            raise RuntimeError(f"{self.nacked} raw publishes were nacked")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class _SendTask(Publisher):
    def __init__(self, app: Any) -> None:
        self.app = app

    def send(self, due: float, seq: int) -> None:
        from .apps import TASK_NAME

        self.app.send_task(TASK_NAME, (due, seq))
