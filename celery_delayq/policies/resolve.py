"""Where every retry option of a DelayedRetryTask is resolved: call, then task, then app (docs/retries.md).

The first of ``self.retry(delayq_*=...)``, the task's ``delayq_*`` attributes and the ``delayq_*`` settings
that sets an option wins; a policy is resolved slot by slot, and slots nobody sets come from the task's
Celery options (:meth:`RetryPolicy.from_celery`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kombu.utils.imports import symbol_by_name

from ..config import DelayqConfig
from .policy import RetryPolicy

__all__ = ["RetryOptions", "resolve_options", "OPTION_NAMES", "split_call_options"]

#: Options a task or a ``self.retry`` call may set, each spelled ``delayq_<name>``.
OPTION_NAMES = ("policy", "wait", "stop", "retry", "max_delay", "park", "park_on", "parking_queue", "dedup")
_SLOTS = ("wait", "stop", "retry")
_UNSET = object()


@dataclass(frozen=True)
class RetryOptions:
    """The resolved retry options of one task (for one retry call).

    Attributes:
        policy: The tenacity-style policy, or ``None`` when the task sets none
            anywhere: then Celery's own options decide, exactly as in Celery.
        max_delay: Cap on explicit delays (:class:`RetryAfter`), in seconds.
        park: Park messages whose retries are exhausted.
        park_on: Exceptions that park a message at once, without retrying.
        parking_queue: Where parked messages go.
        dedup: Run the duplicate-delivery guard for this task.
    """

    policy: RetryPolicy | None
    max_delay: float
    park: bool
    park_on: tuple[type[BaseException], ...]
    parking_queue: str
    dedup: bool


def split_call_options(options: dict[str, Any]) -> dict[str, Any]:
    """Remove and return the ``delayq_*`` keywords of a ``retry()`` call.

    Raises:
        TypeError: an unknown ``delayq_*`` keyword, listing the known ones.
    """
    call = {k: options.pop(k) for k in [k for k in options if k.startswith("delayq_")]}
    unknown = sorted(set(call) - {f"delayq_{n}" for n in OPTION_NAMES})
    if unknown:
        raise TypeError(f"unknown retry option(s) {', '.join(unknown)}; known: "
                        + ", ".join(f"delayq_{n}" for n in OPTION_NAMES))
    return call


def resolve_options(task: Any, config: DelayqConfig, call: Mapping[str, Any] | None = None) -> RetryOptions:
    """Resolve every option for ``task`` (call options first, then task, then ``config``)."""
    call = call or {}

    def pick(name: str, app_value: Any = None) -> Any:
        value = call.get(f"delayq_{name}", _UNSET)
        if value is _UNSET or value is None:
            value = getattr(task, f"delayq_{name}", None)
        return app_value if value is None else value

    max_delay = pick("max_delay", config.max_delay)
    if max_delay is None:
        max_delay = getattr(task, "retry_backoff_max", 600)  # Celery's cap on its own backoff
    return RetryOptions(
        policy=_resolve_policy(task, config, call),
        max_delay=float(max_delay),
        park=bool(pick("park", config.park)),
        park_on=_exception_types(pick("park_on", config.park_on)),
        parking_queue=pick("parking_queue") or config.parking_queue_name,
        dedup=bool(pick("dedup", config.dedup)),
    )


def _resolve_policy(task: Any, config: Any, call: Mapping[str, Any]) -> RetryPolicy | None:
    levels = (
        (call.get("delayq_wait"), call.get("delayq_stop"), call.get("delayq_retry"),
         RetryPolicy.coerce(call.get("delayq_policy"))),
        (getattr(task, "delayq_wait", None), getattr(task, "delayq_stop", None),
         getattr(task, "delayq_retry", None), RetryPolicy.coerce(getattr(task, "delayq_policy", None))),
        (None, None, None, RetryPolicy.coerce(config.retry_policy)),
    )
    slots: dict[str, Any] = {}
    for *single, policy in levels:
        for name, value in zip(_SLOTS, single, strict=True):
            if value is not None:
                slots.setdefault(name, value)
            elif policy is not None and getattr(policy, name) is not None:
                slots.setdefault(name, getattr(policy, name))
    if not slots:
        return None
    return RetryPolicy(**slots).with_defaults(RetryPolicy.from_celery(task))


def _exception_types(value: Any) -> tuple[type[BaseException], ...]:
    if not value:
        return ()
    items = value if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    types: list[type[BaseException]] = []
    for item in items:
        cls = symbol_by_name(item) if isinstance(item, str) else item
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(f"delayq_park_on takes exception classes or 'module.Name' strings, got {item!r}")
        types.append(cls)
    return tuple(types)
