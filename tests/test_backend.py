"""``delayq_backend``: the delay backend chosen by name, and asked for everything backend-shaped.

The producer schedules through ``AppLadder.scheduler``, which places each message
with that backend; ``batch()`` pipelines that backend's confirms, and the worker step starts the worker
services of every backend in use (the app's and each ``delayq_queue_backends`` queue's). The broker tests use
a backend given by its ``"module:Class"`` path (a ladder that counts what it is asked), so they fail if any of
the three reaches past the setting to the ladder publisher.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any, Callable, Iterator

import pytest
from celery import Celery
from kombu.connection import Connection

import celery_delayq
from celery_delayq.config import BACKEND_ALIASES, DelayqConfig
from celery_delayq.glue.app_ladder import AppLadder
from celery_delayq.rabbitmq.publisher import LadderPublisher
from celery_delayq.rabbitmq.buckets import DueBuckets
from celery_delayq.rabbitmq.worker import LadderWorker
from celery_delayq.typing import DelayBackend, Scheduling
from helpers import Collector, running_worker

#: What the counting backend was asked, by call.
ASKED: list[str] = []


class CountingLadder(LadderPublisher):
    """The ladder, counting each call of the backend contract (named by its path in the tests)."""

    @classmethod
    def for_connection(cls, connection: Connection, config: DelayqConfig) -> "CountingLadder":
        ASKED.append("for_connection")
        return cls(connection, config)

    def place(self, body: bytes | str, **kwargs: Any) -> Any:
        ASKED.append("place")
        return super().place(body, **kwargs)

    @contextlib.contextmanager
    def confirming(self) -> Iterator[None]:
        ASKED.append("confirming")
        with super().confirming():
            yield

    def worker_service(self, connection_for: Callable[[str], Connection], scheduling: Scheduling) -> LadderWorker:
        ASKED.append("worker_service")
        return super().worker_service(connection_for, scheduling)


PATH = f"{__name__}:CountingLadder"

#: What the per-queue backend's own worker service was asked.
SERVICE: list[str] = []


class _OwnService:
    """A worker service of its own (not the ladder's), recording its life."""

    def start(self) -> str:
        SERVICE.append("start")
        return "test backend's own service started"

    def stop(self) -> None:
        SERVICE.append("stop")

    def shutdown(self) -> None:
        SERVICE.append("shutdown")


class ServicedLadder(LadderPublisher):
    """A per-queue backend (a ladder publisher of its own) whose workers run a service of its own."""

    @classmethod
    def for_connection(cls, connection: Connection, config: DelayqConfig) -> "ServicedLadder":
        return cls(connection, config)

    def worker_service(self, connection_for: Callable[[str], Connection], scheduling: Scheduling) -> Any:
        return _OwnService()


SERVICED = f"{__name__}:ServicedLadder"


def _ladder(**conf: Any) -> AppLadder:
    app = Celery("t", broker="amqp://127.0.0.1:1//", set_as_current=False)
    return AppLadder(app, DelayqConfig(**conf))


def test_the_default_backend_is_the_buckets_over_the_ladder_publisher() -> None:
    ladder = _ladder()
    assert (ladder.config.backend, ladder.config.bucket_after, ladder.config.bucket_min_delay) == ("buckets", 100, 30.0)
    assert isinstance(ladder.backend, DueBuckets) and ladder.backend.ladder is ladder.publisher
    assert isinstance(ladder.backend, DelayBackend)
    assert BACKEND_ALIASES["buckets"] == "celery_delayq.rabbitmq.buckets:DueBuckets"


def test_the_ladder_alone_is_the_ladder_publisher_itself() -> None:
    ladder = _ladder(backend="ladder")
    assert ladder.backend is ladder.publisher
    assert BACKEND_ALIASES["ladder"] == "celery_delayq.rabbitmq.publisher:LadderPublisher"


def test_an_unknown_backend_name_is_refused_with_the_choices() -> None:
    choices = re.escape(str(sorted(BACKEND_ALIASES)))  # ['fixed', 'ladder', ...]: every row of the table
    with pytest.raises(ValueError, match=rf"delayq_backend must be one of {choices} or a 'module:Class' path"):
        DelayqConfig(backend="nope")


def test_a_backend_path_is_built_once_per_app_ladder_by_its_class() -> None:
    ASKED.clear()
    ladder = _ladder(backend=PATH)
    backend = ladder.backend
    assert isinstance(backend, CountingLadder) and ladder.backend is backend
    assert ASKED == ["for_connection"]


def test_the_producer_batch_and_worker_ask_the_chosen_backend(make_app, collector: Collector) -> None:
    ASKED.clear()
    app = make_app(delayq_enabled=True, delayq_backend=PATH)
    celery_delayq.install(app)

    @app.task
    def probe(due: float) -> None:
        collector.add(due=due)

    with running_worker(app):
        assert "worker_service" in ASKED  # the worker step asked the backend, not the publisher
        probe.apply_async((time.time() + 0.3,), countdown=0.3)
        with celery_delayq.batch(app):
            for _ in range(3):
                probe.apply_async((time.time() + 0.3,), countdown=0.3)
        runs = collector.wait_for(4, timeout=20)
    assert all(run["at"] >= run["due"] for run in runs)  # never early
    assert ASKED.count("place") == 4 and ASKED.count("confirming") == 1
    assert ASKED.count("for_connection") == 1


def test_the_worker_starts_the_service_of_every_backend_in_use_once(make_app, collector: Collector) -> None:
    """The app's backend and a ``delayq_queue_backends`` queue's each get their service started, once."""
    ASKED.clear()
    SERVICE.clear()
    app = make_app(delayq_enabled=True, delayq_backend=PATH,
                   delayq_queue_backends={"elsewhere": SERVICED, "again": SERVICED, "same": PATH})
    celery_delayq.install(app)

    @app.task
    def probe(due: float) -> None:
        collector.add(due=due)

    with running_worker(app):
        assert SERVICE == ["start"]  # the per-queue backend's own service (two queues, one backend: once)
        assert ASKED.count("worker_service") == 1  # the default's too, once though a queue names it again
        probe.apply_async((time.time() + 0.3,), countdown=0.3)
        collector.wait_for(1, timeout=20)
    assert SERVICE[0] == "start" and SERVICE[-1] == "shutdown"
