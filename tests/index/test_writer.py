"""index/writer.py on the broker: the entries of what a publish scheduled, written without holding it up."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

import celery_delayq
from celery_delayq.pending import pending

pytestmark = pytest.mark.timeout(120)


def test_a_publish_does_not_wait_for_an_index_write_in_flight(make_app) -> None:
    """The background write (every 0.25 s) holds the writer's connection while it waits for its confirms; a
    publish only appends to the buffer, so it never waits for that write, and every entry is still written."""
    app = make_app(delayq_enabled=True, delayq_prefix=f"dqw{uuid.uuid4().hex[:6]}")

    @app.task(name=f"{app.main}.probe")
    def probe(i: int) -> None: ...

    ids = [probe.apply_async((0,), countdown=300).id]  # connects the ladder and the index writer
    writer = celery_delayq.ladder_for(app).scheduler.index
    assert writer is not None
    holding, release = threading.Event(), threading.Event()

    def write_in_flight() -> None:
        with writer._io_lock:  # as a write waiting for its confirms does
            holding.set()
            release.wait(20)

    thread = threading.Thread(target=write_in_flight)
    thread.start()
    assert holding.wait(5)
    try:
        started = time.monotonic()
        ids += [probe.apply_async((i,), countdown=300).id for i in range(1, 21)]
        took = time.monotonic() - started
    finally:
        release.set()
        thread.join()
    assert took < 5, f"20 publishes took {took:.1f} s behind a write in flight"
    listed: Any = pending(app, task=f"{app.main}.*")
    assert {t.task_id for t in listed} == set(ids)
