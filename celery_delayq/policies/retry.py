"""Retry predicates that tenacity lacks: Celery's ``autoretry_for``, as a tenacity strategy."""

from __future__ import annotations

from dataclasses import dataclass

from tenacity import RetryCallState
from tenacity.retry import retry_base

__all__ = ["retry_if_celery_autoretry"]


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
