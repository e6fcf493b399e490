"""``celery_delayq.glue.attempts``: what one attempt knows beyond Celery's request. Pure: no broker.

The requests are Celery's own ``Context`` objects, as a worker hands them to a task.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator

import pytest
from celery.app.task import Context

from celery_delayq.ladder import headers as H
from celery_delayq.glue.attempts import (
    Attempt, begin_attempt, current_attempt, end_attempt, first_attempt_time, state_for,
)
from celery_delayq.glue.request import RAW_KEY


@pytest.fixture(autouse=True)
def _no_attempt_left() -> Iterator[None]:
    end_attempt(None)
    yield
    end_attempt(None)


def request(task_id: str = "t1", retries: int = 0, **fields: Any) -> Any:
    return Context(id=task_id, retries=retries, **fields)


def test_begin_records_the_attempt_and_end_restores_the_outer_one() -> None:
    before = time.time()
    outer, previous = begin_attempt(request("outer"))
    assert previous is None
    assert outer.task_id == "outer" and before <= outer.started <= time.time()
    inner, previous = begin_attempt(request("inner"))  # e.g. a task called inline from another
    assert previous is outer
    assert current_attempt(request("inner")) is inner
    end_attempt(previous)
    assert current_attempt(request("outer")) is outer


def test_current_attempt_of_an_unrecorded_task_starts_one_now() -> None:
    recorded, _ = begin_attempt(request("a"))
    other = current_attempt(request("b"))  # e.g. a custom __call__ that skipped begin_attempt
    assert other is not recorded and other.task_id == "b"
    assert current_attempt(request("b")) is other


def test_attempts_are_per_thread() -> None:
    mine, _ = begin_attempt(request("same-id"))
    seen: list[Attempt] = []
    thread = threading.Thread(target=lambda: seen.append(current_attempt(request("same-id"))))
    thread.start()
    thread.join()
    assert seen[0] is not mine
    assert current_attempt(request("same-id")) is mine


def test_begin_takes_the_raw_message_off_the_request() -> None:
    properties = {RAW_KEY: b'{"x": 1}', "application_headers": {"task": "t"}, "priority": 3}
    req = request("raw", properties=properties,
                  delivery_info={"exchange": "work", "routing_key": "work.key"})
    attempt, _ = begin_attempt(req)
    assert attempt.raw is not None
    assert attempt.raw.body == b'{"x": 1}'
    assert attempt.raw.headers == {"task": "t"}
    assert (attempt.raw.exchange, attempt.raw.routing_key) == ("work", "work.key")
    # The task sees the properties as Celery gives them: the raw body is gone.
    assert RAW_KEY not in req.properties and req.properties["priority"] == 3
    assert RAW_KEY in properties  # the request's original dict is not changed


def test_no_raw_message_when_the_worker_did_not_capture_one() -> None:
    attempt, _ = begin_attempt(request("plain", properties={"priority": 0}))
    assert attempt.raw is None


def test_first_attempt_time_is_the_attempt_start_on_the_first_run() -> None:
    attempt, _ = begin_attempt(request("first"))
    # A first run ignores a header it may have copied from elsewhere.
    assert first_attempt_time(request("first", **{H.FIRST_ATTEMPT: 5.0})) == attempt.started


def test_first_attempt_time_comes_from_the_header_on_a_retry() -> None:
    begin_attempt(request("retry", retries=2))
    assert first_attempt_time(request("retry", retries=2, **{H.FIRST_ATTEMPT: "1700000000.5"})) == 1_700_000_000.5


def test_a_malformed_or_missing_header_falls_back_to_the_attempt_start(caplog: pytest.LogCaptureFixture) -> None:
    attempt, _ = begin_attempt(request("bad", retries=1))
    with caplog.at_level(logging.WARNING, logger="celery_delayq.glue.attempts"):
        assert first_attempt_time(request("bad", retries=1, **{H.FIRST_ATTEMPT: "soon"})) == attempt.started
    assert "malformed" in caplog.text
    assert first_attempt_time(request("bad", retries=1)) == attempt.started


def test_state_for_counts_attempts_and_time_since_the_first() -> None:
    exc = ValueError("boom")
    state = state_for(request("s", retries=3, **{H.FIRST_ATTEMPT: 1000.0}), exc, now=1060.0)
    assert state.attempt_number == 4  # three retries: the fourth attempt just failed
    assert state.outcome is not None and state.outcome.failed
    assert state.outcome.exception() is exc
    assert state.seconds_since_start == pytest.approx(60.0, abs=0.01)


def test_state_for_the_first_attempt_starts_at_the_attempt() -> None:
    attempt, _ = begin_attempt(request("f"))
    state = state_for(request("f"), RuntimeError("x"), now=attempt.started + 2.5)
    assert state.attempt_number == 1
    assert state.seconds_since_start == pytest.approx(2.5, abs=0.01)
