"""``RetryPolicy``: tenacity's wait/stop/retry triple, evaluated one attempt at a time (docs/retries.md).

A task's attempts run in many processes, days apart, so each evaluates the strategies on a state rebuilt
from the headers (:func:`~celery_delayq.policies.state.call_state`), in tenacity's order: retry predicate,
wait (the ladder delay), then stop. Any tenacity strategy, or a whole ``tenacity.Retrying``, fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal

import tenacity
from tenacity import RetryCallState

from .celery_rules import retry_if_celery_autoretry, stop_after_retries, wait_celery_backoff

__all__ = ["RetryPolicy", "PolicyVerdict", "describe"]

Strategy = Callable[[RetryCallState], Any]


@dataclass(frozen=True)
class PolicyVerdict:
    """What a :class:`RetryPolicy` says of a failed attempt (its strategies alone).

    The task's whole decision, which also weighs ``RetryAfter``, ``park_on``
    and ``max_retries``, is :class:`~celery_delayq.policies.decision.RetryDecision`.

    Attributes:
        action: ``retry`` (after ``delay`` seconds), ``stop`` (the stop rule
            gave up: retries are exhausted) or ``fail`` (the retry predicate
            does not retry this outcome).
        delay: Seconds to wait before the next attempt (``retry`` only).
    """

    action: Literal["retry", "stop", "fail"]
    delay: float = 0.0

    @property
    def retry(self) -> bool:
        """True when the task should run again."""
        return self.action == "retry"


@dataclass(frozen=True, repr=False)
class RetryPolicy:
    """A retry policy as values: ``wait``, ``stop`` and ``retry`` strategies (tenacity's or ours).

    A slot left ``None`` is filled by :meth:`with_defaults`, usually from the
    task's Celery options (:meth:`from_celery`).

    Example::

        RetryPolicy(wait=wait_exponential(multiplier=0.5, max=60) + wait_random(0, 1),
                    stop=stop_after_attempt(8) | stop_after_delay(3600),
                    retry=retry_if_exception_type(IOError))
    """

    wait: Strategy | None = None
    stop: Strategy | None = None
    retry: Strategy | None = None

    @classmethod
    def from_tenacity(cls, retrying: tenacity.BaseRetrying) -> "RetryPolicy":
        """The wait/stop/retry of a ``tenacity.Retrying`` (its callbacks and ``reraise`` do not apply)."""
        return cls(wait=retrying.wait, stop=retrying.stop, retry=retrying.retry)

    @classmethod
    def coerce(cls, value: object) -> "RetryPolicy | None":
        """A ``RetryPolicy`` from a policy, a ``tenacity.Retrying`` or ``None``.

        Raises:
            TypeError: for anything else, naming what is accepted.
        """
        if value is None or isinstance(value, RetryPolicy):
            return value
        if isinstance(value, tenacity.BaseRetrying):
            return cls.from_tenacity(value)
        raise TypeError(f"a retry policy must be a celery_delayq.RetryPolicy or a tenacity.Retrying, "
                        f"got {value!r}")

    @classmethod
    def from_celery(cls, task: Any) -> "RetryPolicy":
        """The policy Celery's own options on ``task`` describe.

        ``retry_backoff`` (with ``retry_backoff_max`` and ``retry_jitter``) or
        else ``retry_kwargs['countdown']`` or ``default_retry_delay`` for the
        wait; ``max_retries`` for the stop; ``autoretry_for`` and
        ``dont_autoretry_for`` (any ``Exception`` when unset) for the retry predicate.
        """
        backoff = getattr(task, "retry_backoff", False)
        retry_kwargs = getattr(task, "retry_kwargs", None) or {}
        wait: Strategy
        if backoff:
            wait = wait_celery_backoff(factor=float(backoff), maximum=getattr(task, "retry_backoff_max", 600),
                                       jitter=getattr(task, "retry_jitter", True))
        else:
            wait = tenacity.wait_fixed(retry_kwargs.get("countdown", task.default_retry_delay))
        max_retries = retry_kwargs.get("max_retries", task.max_retries)
        return cls(
            wait=wait,
            stop=stop_after_retries(max_retries),
            retry=retry_if_celery_autoretry(tuple(getattr(task, "autoretry_for", ()) or (Exception,)),
                                            tuple(getattr(task, "dont_autoretry_for", ()) or ())),
        )

    def with_defaults(self, defaults: "RetryPolicy") -> "RetryPolicy":
        """This policy with its empty slots taken from ``defaults``."""
        return RetryPolicy(wait=self.wait if self.wait is not None else defaults.wait,
                           stop=self.stop if self.stop is not None else defaults.stop,
                           retry=self.retry if self.retry is not None else defaults.retry)

    def replace(self, **slots: Strategy | None) -> "RetryPolicy":
        """A copy with some slots replaced."""
        return dataclasses.replace(self, **slots)

    def decide(self, state: RetryCallState, *, delay: float | None = None,
               check_retry: bool = True) -> PolicyVerdict:
        """Evaluate one finished attempt, in tenacity's order: retry?, wait, stop?

        Args:
            state: The attempt (see :func:`~celery_delayq.policies.call_state`).
            delay: An explicit delay that replaces the wait strategy (a
                countdown passed to ``self.retry`` or a :class:`RetryAfter`).
            check_retry: ``False`` when the task asked for the retry itself,
                so the retry predicate is not consulted.
        """
        if check_retry and self.retry is not None and not self.retry(state):
            return PolicyVerdict("fail")
        if delay is None:
            delay = float(self.wait(state)) if self.wait is not None else 0.0
        state.upcoming_sleep = max(0.0, delay)  # stop_before_delay looks at it
        if self.stop is not None and self.stop(state):
            return PolicyVerdict("stop")
        return PolicyVerdict("retry", max(0.0, delay))

    def __repr__(self) -> str:
        return (f"RetryPolicy(wait={describe(self.wait)}, stop={describe(self.stop)}, "
                f"retry={describe(self.retry)})")


def describe(strategy: Any) -> str:
    """A readable one-line form of a strategy; tenacity's own classes have no ``repr``."""
    if strategy is None or dataclasses.is_dataclass(strategy) or not _is_tenacity(strategy):
        return repr(strategy)
    attrs = vars(strategy)
    parts: list[str] = []
    for name, value in attrs.items():
        if name == "predicate" and len(attrs) > 1:
            continue  # built from the other fields
        if name in ("wait_funcs", "stops", "retries"):  # tenacity's combinators
            parts.extend(describe(v) for v in value)
        else:
            parts.append(f"{name}={_value(value)}")
    return f"{type(strategy).__name__.lstrip('_')}({', '.join(parts)})"


def _is_tenacity(obj: Any) -> bool:
    return (type(obj).__module__ or "").startswith("tenacity")


def _value(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, tuple):
        return "(" + ", ".join(_value(v) for v in value) + ")"
    if _is_tenacity(value):
        return describe(value)
    if callable(value):
        return str(getattr(value, "__qualname__", repr(value)))
    return repr(value)
