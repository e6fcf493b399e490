"""Wait strategies that tenacity lacks: Celery's own backoff, as a tenacity strategy.

They subclass tenacity's ``wait_base``, so they compose with tenacity's own
(``wait_celery_backoff(2) + wait_random(0, 1)``), and they are frozen
dataclasses, so they print and compare by value.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery.utils.time import get_exponential_backoff_interval
from tenacity import RetryCallState
from tenacity.wait import wait_base

__all__ = ["wait_celery_backoff"]


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
