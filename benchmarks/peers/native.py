"""Peer (b): Celery's native delayed delivery (kombu's 28-level, 1 s-unit ladder).

Set up the only way Celery both activates it and publishes safely: the
destination is a quorum queue behind a topic exchange, and
``confirm_publish`` is on, so every ``apply_async`` waits for its confirm.
Celery computes the ladder routing key from ``int(countdown)``, so a
fractional delay is truncated and the message reaches the queue early; a
real worker then holds the remainder as an ETA.

Celery refuses an eta less than 1 s away (``int(countdown)`` is 0:
``ValueError: countdown must be a positive number``). A delay drawn at
exactly 1.0 s is less than 1 s away by the time Celery computes the
countdown, so such an eta is handed to Celery as ``now + 1.001 s``; the
body keeps the requested due time, so lateness is still measured against it
(this costs native at most ~1 ms on the few messages concerned).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from .apps import QUEUES, make_app, native_queue
from .base import Peer, Publisher

LEVELS = 28
#: Smallest countdown Celery's native routing accepts, plus a millisecond of slack.
MIN_COUNTDOWN = 1.001


class NativePeer(Peer):
    """Celery native delayed delivery, ``confirm_publish`` on."""

    name = "native"
    title = "Celery native (quorum, confirms)"
    modes = ("apply_async",)
    worker_system = "native"

    def __init__(self, url: str, **opts: Any) -> None:
        super().__init__(url, **opts)
        self._app: Any = None
        self._task: Any = None

    @property
    def dest_queue(self) -> str:
        return QUEUES["native"]

    def app(self) -> tuple[Any, Any]:
        if self._app is None:
            self._app, self._task = make_app("native", self.url, confirm=True)
        return self._app, self._task

    def declare(self) -> None:
        from kombu.transport.native_delayed_delivery import (
            bind_queue_to_native_delayed_delivery_exchange,
            declare_native_delayed_delivery_exchanges_and_queues,
        )

        app, _ = self.app()
        with app.connection_for_write() as conn:
            declare_native_delayed_delivery_exchanges_and_queues(conn, "quorum")
            q = native_queue()
            q(conn.default_channel).declare()
            bind_queue_to_native_delayed_delivery_exchange(conn, q)

    def publisher(self, mode: str) -> Publisher:
        if mode != "apply_async":
            raise ValueError(f"unknown native mode {mode!r}")
        _app, task = self.app()
        return _NativeApplyAsync(task)

    def queues(self) -> list[str]:
        return [f"celery_delayed_{k}" for k in range(LEVELS)] + [self.dest_queue]

    def expected_hops(self, delay_s: float) -> float:
        return float(bin(int(delay_s)).count("1"))



class _NativeApplyAsync(Publisher):
    def __init__(self, task: Any) -> None:
        self.task = task
        self.raised_floor = 0

    def send(self, due: float, seq: int) -> None:
        for margin in (MIN_COUNTDOWN, 1.05, 1.25):  # a preempted process can lose the first margin
            eta = max(due, time.time() + margin)
            try:
                self.task.apply_async((due, seq), eta=datetime.fromtimestamp(eta, tz=timezone.utc))
            except ValueError:
                continue
            if eta > due:
                self.raised_floor += 1
            return
        raise ValueError(f"Celery refused eta {due} three times (countdown < 1 s)")
