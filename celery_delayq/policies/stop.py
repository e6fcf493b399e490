"""Stop strategies that tenacity lacks: Celery's ``max_retries``, as a tenacity strategy."""

from __future__ import annotations

from dataclasses import dataclass

from tenacity import RetryCallState
from tenacity.stop import stop_base

__all__ = ["stop_after_retries"]


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
