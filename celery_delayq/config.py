"""One configuration object, resolved from Celery's ``app.conf``.

Every setting is an ordinary Celery setting named ``delayq_*``, so it can be
set on the app, in a config module, or in Django settings as ``CELERY_DELAYQ_*``
(with ``app.config_from_object('django.conf:settings', namespace='CELERY')``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .ladder import LadderSpec
from .queue_delays import normalize_queue_delays

__all__ = ["DelayqConfig", "SETTINGS"]


@dataclass(frozen=True)
class DelayqConfig:
    """Resolved settings. The defaults below are the documented defaults.

    Attributes:
        enabled: Route *every* delayed publish of the app through the ladder,
            not only those of :class:`~celery_delayq.DelayedRetryTask` tasks.
        prefix: Namespace of the ladder's exchanges and queues.
        unit_ms: Ladder resolution. 10 ms: each quorum hop costs ~2.5 ms here,
            so a finer unit buys little accuracy for more hops (see README).
        levels: Number of levels; with ``unit_ms=10`` and radix 4, 14 levels hold
            up to ~31 days while the top TTL stays within Erlang's 2^32 ms timers.
        radix: Digit base of the ladder (2 = binary; 4 measured twice as fast at
            saturation with fewer hops, see README "Design trade-offs").
        queue_type: ``auto`` (quorum where the broker supports TTL on it, else
            classic), ``quorum`` or ``classic``.
        declare: Declare the ladder (idempotent). ``False`` = verify only.
        confirm_timeout: Seconds to wait for a publisher confirm.
        batch_window: Unconfirmed messages allowed in flight inside
            :func:`~celery_delayq.batch` before the publisher waits.
        broker_url: Broker for the ladder; default is the app's write broker.
        telemetry_dir: Root directory of the JSON Lines telemetry (``None`` = off);
            ``python -m celery_delayq.analytics`` turns it into a report.
        queue_delays: Default delay in seconds per destination queue name, e.g.
            ``{"slow": 30}``. Tasks sent there without a countdown or eta wait
            that long; their own countdown/eta wins. Stored as sorted
            ``(name, seconds)`` pairs so the config stays hashable.
        park: Move messages whose retries are exhausted to a parking queue.
        parking_queue: Name of the parking queue; ``None`` = ``<prefix>.parking``.
        parking_queue_type: ``auto`` (the ladder's queue type), ``quorum`` or ``classic``.
        park_on: Exception types (or ``"module.Name"`` strings) that park a
            message at once instead of failing it or retrying it.
        retry_policy: App-wide :class:`~celery_delayq.policies.RetryPolicy` or
            ``tenacity.Retrying`` for DelayedRetryTask tasks without their own.
        max_delay: Cap on explicit delays (:class:`~celery_delayq.policies.RetryAfter`);
            ``None`` = the task's ``retry_backoff_max`` (Celery's default 600 s).
        dedup: Run a second delivery of the same (task id, attempt) zero times
            (state in Redis at ``dedup_url``); see docs/retry-policies.md.
        dedup_url: Redis URL of the duplicate guard.
        dedup_ttl: Seconds a delivery is remembered by the duplicate guard.
    """

    enabled: bool = False
    prefix: str = "delayq"
    unit_ms: int = 10
    levels: int = 14
    radix: int = 4
    queue_type: str = "auto"
    declare: bool = True
    confirm_timeout: float = 30.0
    batch_window: int = 1000
    broker_url: str | None = None
    telemetry_dir: str | None = None
    queue_delays: Any = ()
    park: bool = True
    parking_queue: str | None = None
    parking_queue_type: str = "auto"
    park_on: Any = ()
    retry_policy: Any = None
    max_delay: float | None = None
    dedup: bool = False
    dedup_url: str = "redis://localhost:6379/0"
    dedup_ttl: float = 86400.0

    def __post_init__(self) -> None:
        # Settings arrive as dicts and lists; the config is a dict key of the
        # process-wide publisher registry, so keep every field hashable.
        object.__setattr__(self, "queue_delays", normalize_queue_delays(self.queue_delays, self.spec))
        park_on = self.park_on
        object.__setattr__(self, "park_on", tuple(park_on) if isinstance(park_on, (list, tuple, set)) else (park_on,) if park_on else ())

    @property
    def spec(self) -> LadderSpec:
        """The ladder shape these settings describe."""
        return LadderSpec(prefix=self.prefix, unit_ms=self.unit_ms, levels=self.levels, radix=self.radix)

    @classmethod
    def from_app(cls, app: Any) -> "DelayqConfig":
        """Read ``delayq_*`` settings from a Celery app (Django's ``CELERY_DELAYQ_*`` too)."""
        conf = app.conf
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = _lookup(conf, f"delayq_{f.name}")
            if value is not None:
                values[f.name] = value
        return cls(**values)


def _lookup(conf: Any, key: str) -> Any:
    # Celery maps namespaced settings (CELERY_FOO) onto known keys only, so
    # for our own keys look at the upper-case namespaced spelling as well.
    for candidate in (key, key.upper(), f"{(conf.get('namespace') or 'CELERY')}_{key.upper()}"):
        try:
            value = conf.get(candidate)
        except Exception:  # pragma: no cover - exotic conf objects
            value = None
        if value is not None:
            return value
    return None


#: Setting name -> default, for documentation and the CLI's ``config`` command.
SETTINGS: dict[str, Any] = {f"delayq_{f.name}": f.default for f in fields(DelayqConfig)}
