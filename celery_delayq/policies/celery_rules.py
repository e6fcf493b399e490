"""Celery's own retry rules as tenacity strategies, which tenacity lacks: ``retry_backoff``, ``max_retries``
and ``autoretry_for``.

They subclass tenacity's bases, so they compose with tenacity's own
(``wait_celery_backoff(2) + wait_random(0, 1)``), and they are frozen
dataclasses, so they print and compare by value.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery.utils.time import get_exponential_backoff_interval
from tenacity import RetryCallState
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

__all__ = ["wait_celery_backoff", "stop_after_retries", "retry_if_celery_autoretry"]


@dataclass(frozen=True)
class wait_celery_backoff(wait_base):  # noqa: N801 - tenacity's naming, so it reads like one
    """Celery's ``retry_backoff``: ``min(maximum, factor * 2**retries)``, with optional full jitter.

    The arguments are coerced exactly as Celery's autoretry coerces
    ``retry_backoff`` and ``retry_backoff_max``, and the maths is Celery's own
    ``get_exponential_backoff_interval``, so delays match Celery's draw for draw.
    """

    factor: float = 1
    maximum: float = 600
    jitter: bool = True

    def __call__(self, retry_state: RetryCallState) -> float:
        return float(get_exponential_backoff_interval(
            factor=int(max(1.0, float(self.factor))),
            retries=retry_state.attempt_number - 1,  # Celery counts retries done, from 0
            maximum=int(self.maximum),
            full_jitter=bool(self.jitter),
        ))


@dataclass(frozen=True)
class stop_after_retries(stop_base):  # noqa: N801 - tenacity's naming
    """Celery's ``max_retries``: give up once ``max_retries`` retries have failed (``None``: never).

    Celery gives up when ``request.retries + 1 > max_retries``; that number is
    tenacity's ``attempt_number``. So ``max_retries=3`` means four runs in all,
    the same as ``stop_after_attempt(4)``.
    """

    max_retries: int | None

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.max_retries is not None and retry_state.attempt_number > self.max_retries


@dataclass(frozen=True)
class retry_if_celery_autoretry(retry_base):  # noqa: N801 - tenacity's naming
    """Retry exceptions in ``autoretry_for`` unless they are in ``dont_autoretry_for`` (Celery's rule)."""

    autoretry_for: tuple[type[BaseException], ...] = (Exception,)
    dont_autoretry_for: tuple[type[BaseException], ...] = ()

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        if self.dont_autoretry_for and isinstance(exc, self.dont_autoretry_for):
            return False
        return isinstance(exc, self.autoretry_for)
