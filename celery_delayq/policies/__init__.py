"""Retry policies for DelayedRetryTask: tenacity strategies, evaluated across processes.

* :class:`RetryPolicy` — the wait/stop/retry triple (tenacity's objects or ours).
* :func:`call_state` — a tenacity ``RetryCallState`` from headers (attempt, first attempt).
* :class:`RetryAfter` / :func:`parse_retry_after` — explicit delays (HTTP 429).
* :func:`resolve_options` — call, then task, then app options, in one place.
* Celery's own rules as tenacity strategies: :class:`wait_celery_backoff`,
  :class:`stop_after_retries`, :class:`retry_if_celery_autoretry`.
"""

from __future__ import annotations

from .explicit import RetryAfter, parse_retry_after
from .policy import PolicyVerdict, RetryPolicy, describe
from .resolve import OPTION_NAMES, RetryOptions, resolve_options, split_call_options
from .celery_rules import retry_if_celery_autoretry, stop_after_retries, wait_celery_backoff
from .state import call_state

__all__ = [
    "RetryPolicy", "PolicyVerdict", "describe", "call_state", "RetryAfter", "parse_retry_after",
    "RetryOptions", "resolve_options", "split_call_options", "OPTION_NAMES",
    "wait_celery_backoff", "stop_after_retries", "retry_if_celery_autoretry",
]
