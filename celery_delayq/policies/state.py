"""Build a tenacity ``RetryCallState`` for an attempt that ran in another process, or another day.

tenacity's ``time.monotonic()`` means nothing across processes, so the state's ``start_time`` is placed
for ``seconds_since_start`` to equal ``now - first_attempt`` (wall clock, from the headers): so
``stop_after_delay`` holds across workers and restarts.
"""

from __future__ import annotations

import time
from typing import Any

import tenacity
from tenacity import Future, RetryCallState

__all__ = ["call_state"]

# Strategies never look at it, but RetryCallState wants one (and __repr__ uses it).
_RETRY_OBJECT = tenacity.Retrying()


def call_state(*, attempt_number: int, first_attempt: float, exception: BaseException | None = None,
               result: Any = None, now: float | None = None,
               retry_object: tenacity.BaseRetrying | None = None) -> RetryCallState:
    """A finished attempt as tenacity sees it.

    Args:
        attempt_number: Attempts made so far, the failed one included (1 after
            the first run; Celery's ``request.retries + 1``).
        first_attempt: Wall-clock epoch seconds at which the first attempt started.
        exception: The attempt's exception; ``None`` means it returned ``result``.
        now: Wall-clock time of the outcome (default: now).
    """
    if attempt_number < 1:
        raise ValueError(f"attempt_number counts attempts made and starts at 1, got {attempt_number}")
    wall = time.time() if now is None else now
    mono = time.monotonic()
    state = RetryCallState(retry_object or _RETRY_OBJECT, fn=None, args=(), kwargs={})
    state.attempt_number = attempt_number
    state.outcome = Future.construct(attempt_number, exception if exception is not None else result,
                                     exception is not None)
    state.outcome_timestamp = mono
    state.start_time = mono - max(0.0, wall - first_attempt)
    return state
