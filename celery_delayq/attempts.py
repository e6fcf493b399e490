"""What one attempt of a DelayedRetryTask knows, and what happens when it gives up: parking.

Celery's request tells the attempt number (``retries``) and carries our
headers; this module adds what Celery does not keep: when the attempt
started, the raw message (for an exact parked copy), and the duplicate
guard's key. It also builds the tenacity state of an attempt and parks the
message of a task that gives up.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from tenacity import RetryCallState

from . import headers as H
from . import signals
from .integration import ladder_for
from .parking.capture import RawMessage, take_raw
from .parking.errors import ParkingFailed
from .parking.park import failure_headers, parker_for, parking_message
from .policies.resolve import RetryOptions
from .policies.state import call_state

__all__ = ["Attempt", "begin_attempt", "end_attempt", "current_attempt", "first_attempt_time", "state_for", "park"]

log = logging.getLogger(__name__)

# The running attempt of this thread (greenlet under gevent). Not an attribute of
# Celery's request: Celery copies the request's attributes into a new request
# (push_request) and from there into the headers of a retry.
_local = threading.local()


@dataclass
class Attempt:
    """The running attempt, beyond what Celery's request holds.

    Attributes:
        started: Wall-clock epoch seconds at which the attempt started.
        raw: The message as the worker received it (``None`` if not captured).
        delivery: The duplicate guard's key, when the guard is on.
        settled: A ``retry()`` of this attempt already gave up (and parked), so
            the exception it re-raises must not be handled a second time.
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
    """Wall-clock start of the task's first attempt.

    On a retry it comes from ``x-delayq-first-attempt``, which Celery copies
    from message to message; the first attempt uses its own start time.
    """
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


def park(task: Any, request: Any, exc: BaseException, *, reason: str, options: RetryOptions) -> None:
    """Move the attempt's message to ``options.parking_queue``, confirmed, before the task returns.

    Raises:
        ParkingFailed: the message could not be parked (the task then fails with it).
    """
    attempt = current_attempt(request)
    if attempt.raw is None:
        log.error("delayq: cannot park %s[%s]: the worker did not capture its message; give the task "
                  "delayq_park=True (or keep delayq_park on for the app) and a Request class derived "
                  "from celery_delayq.parking.capture.CapturingRequest", task.name, request.id)
        return
    router = ladder_for(task._get_app())
    config = router.config
    failure = failure_headers(
        task=task.name, task_id=request.id, attempts=int(request.retries or 0) + 1,
        first_attempt=first_attempt_time(request), last_attempt=attempt.started, exc=exc, reason=reason,
        exchange=attempt.raw.exchange, routing_key=attempt.raw.routing_key)
    queue_type = config.queue_type if config.parking_queue_type == "auto" else config.parking_queue_type
    parker = parker_for(router.connection(), queue_type=queue_type, confirm_timeout=config.confirm_timeout)
    try:
        parker.park(options.parking_queue, parking_message(attempt.raw, failure))
    except ParkingFailed as err:
        raise ParkingFailed(f"{task.name}[{request.id}] failed with {exc!r}, and {err}") from exc
    log.warning("delayq: parked %s[%s] in %r (%s: %r)", task.name, request.id, options.parking_queue, reason, exc)
    signals.message_parked.send(sender=task, request=request, exc=exc, queue=options.parking_queue)
