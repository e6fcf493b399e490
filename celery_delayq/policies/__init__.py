"""Retry policies for DelayedRetryTask: tenacity strategies, evaluated across processes (docs/retries.md).

:class:`RetryPolicy` (the wait/stop/retry triple), :func:`call_state` (a tenacity state from the headers),
:class:`RetryAfter` (explicit delays), :func:`resolve_options` (call, then task, then app), and Celery's own
rules as tenacity strategies.
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
