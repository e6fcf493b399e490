"""Shared fixtures of the retry, parking, dedup and CLI tests.

Import the ``*_fixture`` functions you use; pytest registers them under the
name without the suffix (``parked``, ``parking_name``, ``retry_app``, ``events``).

Parking queues here are classic and deleted after each test: quorum queues
cost the shared broker file handles (see ``prefix`` in conftest).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from typing import Any, Callable, Iterator

import amqp
import kombu
import pytest
from celery import signals as celery_signals

from celery_delayq.ladder import headers as H
from celery_delayq import signals
from celery_delayq.parking import ParkingQueue
from celery_delayq.glue.request import RawMessage
from celery_delayq.parking.park import Parker, failure_headers, parking_message

BROKER_HOST = os.environ.get("DELAYQ_TEST_BROKER_HOST", "127.0.0.1:5672")
REDIS_URL = os.environ.get("DELAYQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_up() -> bool:
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(name="parking_name")
def parking_name_fixture(vhost: str, uid: str) -> Iterator[str]:
    """Name of a classic parking queue of this test (deleted afterwards)."""
    name = f"park.{uid}"
    yield name
    with contextlib.suppress(Exception):
        conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
        conn.connect()
        conn.channel().queue_delete(name)
        conn.close()


@pytest.fixture(name="parked")
def parked_fixture(broker_url: str, parking_name: str) -> Iterator[ParkingQueue]:
    """The test's parking queue, to read what was parked."""
    pq = ParkingQueue(kombu.Connection(broker_url), parking_name)
    yield pq
    pq.close()


@pytest.fixture(name="retry_app")
def retry_app_fixture(make_app: Callable[..., Any], parking_name: str) -> Callable[..., Any]:
    """``make_app`` with this test's classic parking queue and a Redis result backend."""
    def factory(**conf: Any) -> Any:
        conf.setdefault("delayq_parking_queue", parking_name)
        conf.setdefault("delayq_parking_queue_type", "classic")
        conf.setdefault("result_backend", REDIS_URL)
        return make_app(**conf)
    return factory


class Events:
    """Every delayq retry signal and Celery task_failure, recorded (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scheduled: list[dict[str, Any]] = []
        self.exhausted: list[dict[str, Any]] = []
        self.parked: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []

    def _add(self, bucket: list[dict[str, Any]], **item: Any) -> None:
        with self.lock:
            bucket.append(item)

    def on_scheduled(self, sender: Any = None, request: Any = None, exc: Any = None, countdown: Any = None,
                     attempt: Any = None, **_: Any) -> None:
        self._add(self.scheduled, task=sender.name, id=request.id, countdown=countdown, attempt=attempt, exc=exc)

    def on_exhausted(self, sender: Any = None, request: Any = None, exc: Any = None, attempt: Any = None,
                     **_: Any) -> None:
        self._add(self.exhausted, task=sender.name, id=request.id, exc=exc, attempt=attempt)

    def on_parked(self, sender: Any = None, request: Any = None, exc: Any = None, queue: Any = None,
                  **_: Any) -> None:
        self._add(self.parked, task=sender.name, id=request.id, exc=exc, queue=queue)

    def on_failure(self, sender: Any = None, task_id: Any = None, exception: Any = None, **_: Any) -> None:
        self._add(self.failures, task=getattr(sender, "name", None), id=task_id, exc=exception)

    def countdowns(self, task_id: str) -> list[float]:
        return [e["countdown"] for e in self.scheduled if e["id"] == task_id]


@pytest.fixture(name="events")
def events_fixture() -> Iterator[Events]:
    ev = Events()
    pairs = [(signals.retry_scheduled, ev.on_scheduled), (signals.retry_exhausted, ev.on_exhausted),
             (signals.message_parked, ev.on_parked), (celery_signals.task_failure, ev.on_failure)]
    for sig, receiver in pairs:
        sig.connect(receiver, weak=False)
    yield ev
    for sig, receiver in pairs:
        sig.disconnect(receiver)


def record_run(collector: Any, task: Any, **extra: Any) -> None:
    """Record one run of a bound task with what the ladder told it."""
    request = task.request
    collector.add(id=request.id, retries=request.retries, delay=request.get(H.DELAY),
                  due=request.get(H.DUE), first=request.get(H.FIRST_ATTEMPT), eta=request.eta,
                  replay=request.get("x-delayq-replay"), **extra)


def park_synthetic(broker_url: str, queue: str, count: int, *, task: str = "proj.sync", exc: Exception,
                   dest: str, parked_at: float | None = None) -> list[str]:
    """Park ``count`` messages as a worker would, without running one (fast); returns their parked ids."""
    parker = Parker(kombu.Connection(broker_url), queue_type="classic")
    ids = []
    try:
        for i in range(count):
            task_id = uuid.uuid4().hex
            raw = RawMessage(body=json.dumps([[i], {}, {}]).encode(), exchange="", routing_key=dest,
                             headers={"task": task, "id": task_id, "retries": 3, "eta": None},
                             properties={"content_type": "application/json", "content_encoding": "utf-8",
                                         "correlation_id": task_id})
            failure = failure_headers(task=task, task_id=task_id, attempts=4, first_attempt=1.0, last_attempt=2.0,
                                      exc=exc, reason="exhausted", exchange="", routing_key=dest, now=parked_at)
            parker.park(queue, parking_message(raw, failure))
            ids.append(failure["x-delayq-parked-id"])
    finally:
        parker.close()
    return ids
