"""One retry decision for a failed attempt: retry (with which delay), give up, or park now. Pure.

``DelayedRetryTask`` asks :func:`decide_retry` (or, for an exception that escaped the task body,
:func:`decide_failure`) and then only acts, handing Celery the countdown and ``max_retries`` that make it do
the same, so Celery's own bookkeeping is unchanged. The rules, in order: docs/retries.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from tenacity import RetryCallState

from ..ladder.delays import parse_eta
from .explicit import RetryAfter
from .resolve import RetryOptions

__all__ = ["RetryDecision", "decide_retry", "decide_failure"]


@dataclass(frozen=True)
class RetryDecision:
    """What one ``retry()`` call does.

    Attributes:
        action: ``retry``; ``give_up`` (retries exhausted: park if enabled, then
            Celery raises as always); ``park_now`` (a ``park_on`` exception).
        countdown: The countdown to hand Celery (``None``: Celery's own default).
        eta: The eta to hand Celery (``None`` unless the caller gave one).
        max_retries: The ``max_retries`` to hand Celery, so that Celery gives up
            exactly when the decision does.
        exc: The exception Celery reports (a RetryAfter's cause, when it has one).
        attempt: Number of the attempt that just failed (1 = the first run).
        delay: Seconds the retry waits: the countdown, the eta's distance from
            now, else the task's ``default_retry_delay`` (what ``retry_scheduled`` reports).
    """

    action: Literal["retry", "give_up", "park_now"]
    countdown: Any
    eta: Any
    max_retries: int | None
    exc: Any
    attempt: int
    delay: float = 0.0


def decide_retry(options: RetryOptions, *, outcome: BaseException | None, exc: Any, attempt: int,
                 countdown: Any, eta: Any, max_retries: int | None, task_max_retries: int | None,
                 state: RetryCallState, now: float, default_delay: float = 180.0) -> RetryDecision:
    """Decide one ``retry()`` call of attempt number ``attempt`` (pure but for ``state``'s strategies).

    Args:
        options: The task's resolved retry options.
        outcome: The exception being handled (``exc`` or the one in flight).
        exc: The ``exc`` given to ``retry()``.
        countdown, eta, max_retries: As given to ``retry()``.
        task_max_retries: The task's own ``max_retries``.
        state: The tenacity state of the failed attempt.
        now: Wall-clock now, to turn an ``eta`` into a delay for the policy.
        default_delay: The task's ``default_retry_delay`` (Celery's wait without a countdown).
    """
    def decided(action: Literal["retry", "give_up", "park_now"], countdown: Any, max_retries: int | None,
                exc: Any) -> RetryDecision:
        delay = float(countdown) if countdown is not None else (
            max(0.0, parse_eta(eta) - now) if eta is not None else float(default_delay))
        return RetryDecision(action, countdown, eta, max_retries, exc, attempt, delay)

    if isinstance(outcome, RetryAfter):
        countdown, eta = min(outcome.delay, options.max_delay), None
        exc = outcome.exc if outcome.exc is not None else outcome
    elif options.park_on and isinstance(outcome, options.park_on):
        return decided("park_now", countdown, max_retries, exc)

    if options.policy is None:  # Celery's rule, unchanged
        limit = task_max_retries if max_retries is None else max_retries
        exhausted = limit is not None and attempt > limit
        return decided("give_up" if exhausted else "retry", countdown, max_retries, exc)

    explicit = countdown if countdown is not None else (
        max(0.0, parse_eta(eta) - now) if eta is not None else None)
    verdict = options.policy.decide(state, delay=explicit, check_retry=False)
    exhausted = verdict.action == "stop" or (max_retries is not None and attempt > max_retries)
    # Celery's own max_retries check must not second-guess the policy; when the policy
    # gives up, a limit just below the attempt makes Celery raise exactly as it always does.
    return decided("give_up" if exhausted else "retry", verdict.delay if explicit is None else countdown,
                   attempt - (1 if exhausted else 0), exc)


def decide_failure(options: RetryOptions, exc: BaseException,
                   state: Callable[[], RetryCallState]) -> Literal["retry", "park", "raise"]:
    """What an exception that escaped the task body leads to, before Celery's own handling.

    ``retry``: a :class:`RetryAfter`, or an exception the policy's ``retry``
    predicate retries (then ``retry()`` decides the rest, :func:`decide_retry`);
    ``park``: an exception in ``park_on``; ``raise``: Celery's handling
    (``autoretry_for``, or failure). ``state`` is called only when the predicate needs it.
    """
    if isinstance(exc, RetryAfter):
        return "retry"
    if options.park_on and isinstance(exc, options.park_on):
        return "park"
    policy = options.policy
    if policy is not None and policy.retry is not None and policy.retry(state()):
        return "retry"
    return "raise"
