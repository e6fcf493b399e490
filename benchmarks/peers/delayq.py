"""Peer (a): celery_delayq, through its four public publish paths.

Modes:

* ``apply_async``        - ``task.apply_async(eta=...)``; each call waits for its own confirm.
* ``apply_async_batch``  - the same inside ``celery_delayq.batch(app)``: confirms pipelined,
  awaited (and a nack raised) at block exit.
* ``publish_batch``      - kombu level: ``Scheduler.schedule_body(body, eta=..., queue=...)``
  inside ``scheduler.batch()``.
* ``schedule_batch``     - kombu level, pre-serialised body: ``Scheduler.schedule(...)``
  inside ``scheduler.batch()``.
* ``schedule_task_batch`` - a complete Celery task message (headers and body built by
  ``app.amqp.as_task_v2``) put into the ladder with ``LadderPublisher.schedule``: what a
  bulk producer would do. Used to drive a real worker at high rates without the
  publishers' own CPU (2 cores here) dominating the measurement.

Ladder options (``radix``, ``unit_ms``, ``levels``, ``queue_type``, ``prefix``,
``batch_window``) are passed through as ``delayq_*`` settings, so the same peer
measures the design trade-offs.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone
from typing import Any, Iterator

import kombu

from .apps import QUEUES, make_app
from .base import Peer, Publisher, raw_body

#: Erlang's timers cap a queue TTL at 2^32 - 1 ms.
MAX_TTL_MS = 2**32 - 1


def levels_for(radix: int, unit_ms: int, cap: int = 29) -> int:
    """Most levels (up to ``cap``) whose top queue TTL still fits Erlang's timer limit."""
    levels = 1
    while levels < cap and (radix - 1) * radix**levels * unit_ms <= MAX_TTL_MS:
        levels += 1
    return levels


def ladder_settings(opts: dict[str, Any]) -> dict[str, Any]:
    """``delayq_*`` settings (without prefix) for the peer options, filling in ``levels``."""
    radix = int(opts.get("radix", 2))
    unit = int(opts.get("unit_ms", 10))
    out = {
        "prefix": opts.get("prefix", "dqb"),
        "radix": radix,
        "unit_ms": unit,
        "levels": int(opts.get("levels") or levels_for(radix, unit, cap=int(opts.get("max_levels", 29 if unit >= 10 else 33)))),
        "queue_type": opts.get("queue_type", "quorum"),
    }
    if opts.get("batch_window"):
        out["batch_window"] = int(opts["batch_window"])
    if int(opts.get("shards", 1)) > 1:
        out["shards"] = int(opts["shards"])
    return out


def variant_label(opts: dict[str, Any]) -> str:
    """``r2 u10ms quorum (29 levels)`` style description of a ladder variant."""
    s = ladder_settings(opts)
    sharded = f", {s['shards']} shards" if s.get("shards", 1) > 1 else ""
    return f"radix {s['radix']}, unit {s['unit_ms']} ms, {s['queue_type']}, {s['levels']} levels{sharded}"


class DelayqPeer(Peer):
    """celery_delayq's ladder; see the module docstring for the modes."""

    name = "delayq"
    title = "celery_delayq"
    modes = ("apply_async", "apply_async_batch", "publish_batch", "schedule_batch", "schedule_task_batch")
    worker_system = "delayq"

    def __init__(self, url: str, **opts: Any) -> None:
        super().__init__(url, **opts)
        self.settings = ladder_settings(opts)
        self._app: Any = None
        self._task: Any = None

    @property
    def dest_queue(self) -> str:
        return QUEUES["delayq"]

    @property
    def spec(self) -> Any:
        from celery_delayq import LadderSpec

        s = self.settings
        return LadderSpec(prefix=s["prefix"], unit_ms=s["unit_ms"], levels=s["levels"], radix=s["radix"],
                          shards=s.get("shards", 1))

    def config(self) -> Any:
        """The :class:`celery_delayq.DelayqConfig` the app would resolve."""
        from celery_delayq import DelayqConfig

        return DelayqConfig(**self.settings)

    def app(self) -> tuple[Any, Any]:
        if self._app is None:
            self._app, self._task = make_app("delayq", self.url, delayq=self.settings)
        return self._app, self._task

    def declare(self) -> None:
        app, _ = self.app()
        with app.connection_for_write() as conn:
            kombu.Queue(self.dest_queue, durable=True)(conn.default_channel).declare()
        import celery_delayq

        celery_delayq.install(app).publisher.declare()

    def kombu_publisher(self) -> Any:
        """The :class:`~celery_delayq.Scheduler` over this broker's and ladder's process-wide backend."""
        from celery_delayq import Scheduler

        return Scheduler.for_connection(kombu.Connection(self.url), self.config())

    def publisher(self, mode: str) -> Publisher:
        if mode in ("apply_async", "apply_async_batch"):
            app, task = self.app()
            return _ApplyAsync(app, task, batched=mode == "apply_async_batch")
        if mode == "publish_batch":
            return _KombuPublish(self.kombu_publisher(), self.dest_queue)
        if mode == "schedule_batch":
            return _KombuSchedule(self.kombu_publisher(), self.dest_queue)
        if mode == "schedule_task_batch":
            app, _task = self.app()
            return _KombuScheduleTask(self.kombu_publisher(), self.dest_queue, app)
        raise ValueError(f"unknown delayq mode {mode!r}")

    def queues(self) -> list[str]:
        spec = self.spec
        return [q.name for q in spec.level_queues()] + [self.dest_queue]

    def expected_hops(self, delay_s: float) -> float:
        spec = self.spec
        return float(spec.hops(spec.units_for(delay_s)))



class _ApplyAsync(Publisher):
    def __init__(self, app: Any, task: Any, *, batched: bool) -> None:
        self.app, self.task, self.batched = app, task, batched

    def send(self, due: float, seq: int) -> None:
        self.task.apply_async((due, seq), eta=datetime.fromtimestamp(due, tz=timezone.utc))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        if not self.batched:
            yield
            return
        import celery_delayq

        with celery_delayq.batch(self.app):
            yield


class _KombuPublish(Publisher):
    def __init__(self, pub: Any, queue: str) -> None:
        self.pub, self.queue = pub, queue

    def send(self, due: float, seq: int) -> None:
        self.pub.schedule_body({"due": due, "seq": seq}, eta=due, queue=self.queue, serializer="json")

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self.pub.batch():
            yield

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pub.default.close()


class _KombuSchedule(_KombuPublish):
    def send(self, due: float, seq: int) -> None:
        import time

        self.pub.schedule(raw_body(due, seq), due=due, delay=due - time.time(), exchange="",
                          routing_key=self.queue, headers={}, content_type="application/json",
                          content_encoding="utf-8")


class _KombuScheduleTask(_KombuPublish):
    def __init__(self, pub: Any, queue: str, app: Any) -> None:
        super().__init__(pub, queue)
        self.app = app

    def send(self, due: float, seq: int) -> None:
        import time
        import uuid

        from .apps import TASK_NAME

        task_id = str(uuid.uuid4())
        eta = datetime.fromtimestamp(due, tz=timezone.utc)
        msg = self.app.amqp.as_task_v2(task_id, TASK_NAME, (due, seq), {}, eta=eta)
        self.pub.schedule(json.dumps(msg.body).encode(), due=due, delay=due - time.time(), exchange="",
                          routing_key=self.queue, headers=dict(msg.headers), content_type="application/json",
                          content_encoding="utf-8", correlation_id=task_id)


def describe(opts: dict[str, Any]) -> dict[str, Any]:
    """Shape of a ladder variant: levels, queue count, max delay (for the report)."""
    from celery_delayq import LadderSpec

    s = ladder_settings(opts)
    spec = LadderSpec(prefix=s["prefix"], unit_ms=s["unit_ms"], levels=s["levels"], radix=s["radix"],
                      shards=s.get("shards", 1))
    return {**s, "queues": (s["radix"] - 1) * s["levels"] * spec.shards, "max_delay_days": round(spec.max_delay_s / 86400, 1),
            "label": variant_label(opts)}


__all__ = ["DelayqPeer", "levels_for", "ladder_settings", "variant_label", "describe"]
