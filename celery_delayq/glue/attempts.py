"""What one attempt of a DelayedRetryTask knows beyond Celery's request: its start, the raw message
(for an exact parked copy), the duplicate guard's key; and its tenacity state."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from tenacity import RetryCallState

from ..ladder import headers as H
from .raw import RawMessage, take_raw
from ..policies.state import call_state

__all__ = ["Attempt", "begin_attempt", "end_attempt", "current_attempt", "first_attempt_time", "state_for"]

log = logging.getLogger(__name__)

# The running attempt of this thread (not on Celery's request, whose attributes end up in a retry's headers).
_local = threading.local()


@dataclass
class Attempt:
    """The running attempt, beyond what Celery's request holds.

    Attributes:
        started: Wall-clock epoch seconds at which the attempt started.
        raw: The message as the worker received it (``None`` if not captured).
        delivery: The duplicate guard's key, when the guard is on.
        settled: A ``retry()`` of this attempt already gave up (and parked): its re-raise is not handled again.
    """

    task_id: str
    started: float
    raw: RawMessage | None = None
    delivery: str | None = None
    settled: bool = False


def begin_attempt(request: Any) -> tuple[Attempt, Attempt | None]:
    """Record the start of an attempt (taking the raw message off ``request``).

    Returns the attempt and the one it replaces, to hand to :func:`end_attempt`.
    """
    previous = getattr(_local, "attempt", None)
    attempt = _local.attempt = Attempt(task_id=request.id, started=time.time(), raw=take_raw(request))
    return attempt, previous


def end_attempt(previous: Attempt | None) -> None:
    """Forget the attempt that :func:`begin_attempt` started (restoring an outer one)."""
    _local.attempt = previous


def current_attempt(request: Any) -> Attempt:
    """The running attempt of ``request``; one starting now if none was recorded (e.g. a custom ``__call__``)."""
    attempt = getattr(_local, "attempt", None)
    if isinstance(attempt, Attempt) and attempt.task_id == request.id:
        return attempt
    return begin_attempt(request)[0]


def first_attempt_time(request: Any) -> float:
    """Wall-clock start of the task's first attempt (on a retry from ``x-delayq-first-attempt``)."""
    if request.retries:
        value = request.get(H.FIRST_ATTEMPT)
        if value is not None:
            try:
                return float(value)
            except (TypeError, ValueError):
                log.warning("delayq: ignoring malformed %s header %r", H.FIRST_ATTEMPT, value)
    return current_attempt(request).started


def state_for(request: Any, exc: BaseException | None, *, now: float | None = None) -> RetryCallState:
    """The tenacity state of the attempt that just ended with ``exc``."""
    return call_state(attempt_number=int(request.retries or 0) + 1,
                      first_attempt=first_attempt_time(request), exception=exc, now=now)
