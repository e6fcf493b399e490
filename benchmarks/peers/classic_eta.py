"""Peer (c): Celery's classic ETA: the message goes to its queue at once, the worker holds it.

Nothing waits in the broker; the worker keeps every pending ETA message
unacknowledged in memory and raises its prefetch as they pile up. Lateness
and memory are therefore only meaningful through a real worker.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import kombu

from .apps import QUEUES, make_app
from .base import Peer, Publisher


class ClassicEtaPeer(Peer):
    """Classic ETA; ``apply_async`` with confirms, or unconfirmed to fill a worker fast."""

    name = "classic"
    title = "Celery classic ETA (worker-held)"
    #: ``now``: the same worker with no delay at all (published when due, confirmed): the floor any
    #: delay mechanism meets through a worker at that rate (its own queueing and Celery's cost per task).
    modes = ("apply_async", "apply_async_unconfirmed", "now")
    worker_system = "classic"

    def __init__(self, url: str, **opts: Any) -> None:
        super().__init__(url, **opts)
        self._apps: dict[bool, tuple[Any, Any]] = {}

    @property
    def dest_queue(self) -> str:
        return QUEUES["classic"]

    def app(self, confirm: bool = True) -> tuple[Any, Any]:
        if confirm not in self._apps:
            self._apps[confirm] = make_app("classic", self.url, confirm=confirm)
        return self._apps[confirm]

    def declare(self) -> None:
        app, _ = self.app()
        with app.connection_for_write() as conn:
            kombu.Queue(self.dest_queue, durable=True)(conn.default_channel).declare()

    def publisher(self, mode: str) -> Publisher:
        if mode not in self.modes:
            raise ValueError(f"unknown classic mode {mode!r}")
        _app, task = self.app(confirm=mode in ("apply_async", "now"))
        return _ApplyNow(task) if mode == "now" else _EtaApplyAsync(task)



class _EtaApplyAsync(Publisher):
    def __init__(self, task: Any) -> None:
        self.task = task

    def send(self, due: float, seq: int) -> None:
        self.task.apply_async((due, seq), eta=datetime.fromtimestamp(due, tz=timezone.utc))


class _ApplyNow(Publisher):
    """No delay: the task is published when it is due and records its publish time as its due time."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def send(self, due: float, seq: int) -> None:
        self.task.apply_async((time.time(), seq))
