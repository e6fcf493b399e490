"""What one ladder pass writes into the headers, and that messages of the previous version read the same.

Every ``x-delayq-*`` header is encoded by the publisher and copied by the
broker at every hop, so a pass writes only what nothing else carries. Messages
already in flight were stamped by 0.x with ``x-delayq-attempt`` on every pass
and ``x-delayq-first-attempt`` from the first publish; readers must give them
the same attempt, index entry and telemetry as before.
"""

from __future__ import annotations

from typing import Any

from celery_delayq.ladder import headers as H
from celery_delayq.index.writer import batch_entry


def _stamp(headers: dict[str, Any]) -> dict[str, Any]:
    return H.stamp_pass(headers, due=100.0, delay=5.0, entry="e1", hops=3, exchange="", routing_key="q")


def test_a_celery_task_pass_carries_no_attempt_and_no_first_attempt() -> None:
    hdrs = _stamp({"id": "t1", "task": "app.add", "retries": 2})
    assert H.ATTEMPT not in hdrs and H.FIRST_ATTEMPT not in hdrs
    assert {H.DUE, H.DELAY, H.ENTRY, H.HOPS, H.EXCHANGE, H.ROUTING_KEY} <= hdrs.keys()
    assert H.attempt_of(hdrs) == 2


def test_a_stale_attempt_from_an_old_pass_gives_way_to_celerys_retries() -> None:
    # A retry copies its request's headers: 0.x stamped attempt 1 on the previous pass.
    hdrs = _stamp({"id": "t1", "retries": 2, H.ATTEMPT: 1, H.FIRST_ATTEMPT: 50.0})
    assert H.ATTEMPT not in hdrs
    assert hdrs[H.FIRST_ATTEMPT] == 50.0  # the first attempt's time survives every pass
    assert H.attempt_of(hdrs) == 2


def test_a_kombu_level_message_carries_its_attempt_only_past_zero() -> None:
    assert H.ATTEMPT not in _stamp({})
    assert H.attempt_of(_stamp({})) == 0
    assert _stamp({H.ATTEMPT: 3})[H.ATTEMPT] == 3


def test_old_headers_read_as_before() -> None:
    """A message stamped by 0.x (attempt on every pass) gives the same attempt and index entry."""
    old = {"id": "t1", "task": "app.add", "retries": 1, H.DUE: 100.0, H.DELAY: 5.0, H.ENTRY: "e1", H.HOPS: 3,
           H.EXCHANGE: "", H.ROUTING_KEY: "q", H.ATTEMPT: 1, H.FIRST_ATTEMPT: 95.0}
    new = _stamp({"id": "t1", "task": "app.add", "retries": 1})
    assert H.attempt_of(old) == H.attempt_of(new) == 1
    assert batch_entry(old, "t1") == batch_entry(new, "t1")
    assert H.attempt_of({H.ATTEMPT: "bad"}) == 0
