"""One configuration object, resolved from Celery's ``app.conf``.

Every setting is an ordinary Celery setting named ``delayq_*``, so it can be
set on the app, in a config module, or in Django settings as ``CELERY_DELAYQ_*``
(with ``app.config_from_object('django.conf:settings', namespace='CELERY')``).
"""

from __future__ import annotations

import difflib
import logging
import math
import weakref
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping

from .errors import DelayTooLong, InvalidDelay
from .ladder.spec import LadderSpec
from .typing import CeleryApp

__all__ = ["DelayqConfig", "SETTINGS", "unknown_settings", "warn_unknown_settings", "normalize_queue_delays",
           "normalize_queue_backends", "BACKEND_ALIASES"]

log = logging.getLogger(__name__)


#: The longest delay accepted without a cap (laps make any length possible; a
#: Celery eta must still be a datetime, and no task waits a century).
LONGEST_DELAY_S = 100 * 365.25 * 86400


#: ``delayq_backend`` names -> ``"module:Class"`` of the backend, as kombu's
#: ``TRANSPORT_ALIASES`` name transports. A new backend is one module and one row here.
BACKEND_ALIASES: dict[str, str] = {
    "ladder": "celery_delayq.rabbitmq.publisher:LadderPublisher",
    "fixed": "celery_delayq.rabbitmq.fixed:FixedDelays",
}


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
        shards: Parallel copies of the ladder's levels; each task takes the one its
            id hashes to, so tasks due together spread over that many times the
            queues, dead-letter workers and (on a cluster) leader nodes. It pays only
            where one queue's dead-letter worker is the limit and the broker has idle
            cores; measured on 2 cores it does not (README "Sharded ladders"). 1 = unsharded.
        queue_type: ``auto`` (quorum where the broker supports TTL on it, else
            classic), ``quorum`` or ``classic``.
        declare: Declare the ladder (idempotent). ``False`` = verify only.
        confirm_timeout: Seconds to wait for a publisher confirm.
        batch_window: Unconfirmed messages allowed in flight inside
            :func:`~celery_delayq.batch` before the publisher waits.
        broker_url: Broker for the ladder; default is the app's write broker.
        management_url: RabbitMQ's management API, for what AMQP cannot tell (bindings,
            held messages, leaders, and on RabbitMQ 3.x whether a new ladder fits the
            broker's file handles; without it a new ladder there is created only by
            ``delayq topology declare``). ``None`` = ``http://<broker host>:15672``;
            ``""`` = never ask it.
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
        max_delay: When set, the longest delay accepted anywhere: a longer countdown or
            eta raises ``DelayTooLong``, and an explicit delay
            (:class:`~celery_delayq.policies.RetryAfter`) is capped to it. Unset, delays
            longer than the ladder make laps through it (years are fine), and a
            RetryAfter is capped by the task's ``retry_backoff_max`` (Celery's default 600 s).
        dedup: Run a second delivery of the same (task id, attempt) zero times
            (state in Redis at ``dedup_url``); see the README, "The duplicate guard".
        dedup_url: Redis URL of the duplicate guard.
        dedup_ttl: Seconds a delivery is remembered by the duplicate guard.
        index: Keep an index of waiting tasks (RabbitMQ streams written by the broker
            itself, see :mod:`celery_delayq.pending`) for ``delayq pending`` and
            ``delayq cancel``; the broker writes one extra copy per ladder pass.
        leader_placement: ``spread`` (the leaders of every queue a new ladder owns, its
            exit and parking queues too, are spread over the cluster's running nodes,
            through a connection to each, which
            needs the management API to list them) or ``broker`` (wherever the
            broker's queue-leader locator puts them; with its default,
            ``client-local``, all on the declaring process's node). Existing
            queues never move; see :mod:`celery_delayq.rabbitmq.placement`.
        metrics_port: Serve Prometheus metrics (:mod:`celery_delayq.metrics`) on this port
            from each worker's main process (``None`` = off). With the prefork pool,
            retries and parks happen in the children and are not counted there.
        backend: Where delayed messages wait: a name of :data:`BACKEND_ALIASES`
            (``ladder``: the TTL-queue ladder) or a ``"module:Class"`` path to a
            :class:`~celery_delayq.typing.DelayBackend` with a ``for_connection(connection,
            config)`` class method (``fixed``: one TTL queue per destination and distinct delay,
            one hop, for apps whose delays take a few fixed values; see
            :mod:`celery_delayq.rabbitmq.fixed`). The delay check, the ``before_schedule`` and
            ``message_scheduled`` signals and the index entry that ``pending`` and ``cancel``
            read are done once above every backend (:mod:`celery_delayq.rabbitmq.scheduling`).
        queue_backends: Backend per destination queue name, e.g. ``{"emails": "fixed"}``
            (names as for ``backend``); other queues use ``backend``. Stored as sorted pairs.
        fixed_resolution: Seconds a ``fixed`` queue's delay is rounded *up* to (never early;
            a message may arrive up to this much late), so delays that differ by noise share one queue.
        fixed_max_delay: The longest delay a ``fixed`` queue holds; a longer one goes through the ladder.
        fixed_queues: The most ``fixed`` queues (destination and delay) one process declares; a new
            delay beyond them goes through the ladder (logged once). On RabbitMQ 3.x each new queue
            must also fit the broker's file-handle budget (:mod:`celery_delayq.rabbitmq.budget`).
        metrics_address: The address the metrics exporter binds (``delayq_metrics_port``
            and ``delayq metrics``). Loopback by default, so the metrics are not
            served to the network unless asked: ``0.0.0.0`` (every IPv4 interface),
            ``::`` or one interface's address is that explicit choice.
        disabled_extensions: Names of built-in extensions to leave out of the app
            (:data:`celery_delayq.glue.extensions.EXTENSIONS`: ``takeover``, ``cancels``,
            ``parking``, ``telemetry``, ``metrics``), e.g. ``["takeover"]`` for workers that
            must not move other publishers' delayed tasks. ``delayq doctor`` lists those active.
    """

    enabled: bool = False
    prefix: str = "delayq"
    unit_ms: int = 10
    levels: int = 14
    radix: int = 4
    shards: int = 1
    queue_type: str = "auto"
    declare: bool = True
    confirm_timeout: float = 30.0
    batch_window: int = 1000
    broker_url: str | None = None
    telemetry_dir: str | None = None
    management_url: str | None = None
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
    index: bool = True
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    disabled_extensions: Any = ()
    leader_placement: str = "spread"
    backend: str = "ladder"
    queue_backends: Any = ()
    fixed_resolution: float = 1.0
    fixed_max_delay: float = 600.0
    fixed_queues: int = 16

    def __post_init__(self) -> None:
        if self.leader_placement not in ("spread", "broker"):
            raise ValueError(f"delayq_leader_placement must be 'spread' or 'broker', got {self.leader_placement!r}")
        if self.backend not in BACKEND_ALIASES and ":" not in self.backend:
            raise ValueError(f"delayq_backend must be one of {sorted(BACKEND_ALIASES)} or a 'module:Class' "
                             f"path, got {self.backend!r}")
        object.__setattr__(self, "queue_backends", normalize_queue_backends(self.queue_backends))
        if not (self.fixed_resolution > 0 and math.isfinite(self.fixed_resolution)):
            raise ValueError(f"delayq_fixed_resolution must be a positive number of seconds, "
                             f"got {self.fixed_resolution!r}")
        # Settings arrive as dicts and lists; the config is a dict key of the
        # process-wide publisher registry, so keep every field hashable.
        object.__setattr__(self, "queue_delays", normalize_queue_delays(self.queue_delays, self.spec))
        disabled = self.disabled_extensions
        object.__setattr__(self, "disabled_extensions",
                           (disabled,) if isinstance(disabled, str) else tuple(disabled or ()))
        park_on = self.park_on
        object.__setattr__(self, "park_on", tuple(park_on) if isinstance(park_on, (list, tuple, set)) else (park_on,) if park_on else ())

    def check_delay(self, seconds: float) -> None:
        """Refuse a delay longer than ``max_delay`` when one is set (``DelayTooLong``).

        Without a cap any finite delay is accepted: one longer than the ladder
        makes laps through it (:mod:`celery_delayq.rabbitmq.laps`).
        """
        if seconds > LONGEST_DELAY_S:
            raise DelayTooLong(
                f"a delay of {seconds:.0f} s is longer than celery_delayq accepts (100 years); "
                "it never truncates a delay")
        if self.max_delay is not None and seconds > self.max_delay:
            from .ladder.humanize import human_duration

            raise DelayTooLong(
                f"a delay of {human_duration(seconds)} ({seconds:.3f} s) exceeds delayq_max_delay "
                f"({human_duration(self.max_delay)}); raise or unset delayq_max_delay to allow it")

    @property
    def spec(self) -> LadderSpec:
        """The ladder shape these settings describe."""
        return LadderSpec(prefix=self.prefix, unit_ms=self.unit_ms, levels=self.levels, radix=self.radix,
                          shards=self.shards)

    @classmethod
    def from_app(cls, app: CeleryApp) -> "DelayqConfig":
        """Read ``delayq_*`` settings from a Celery app (Django's ``CELERY_DELAYQ_*`` too)."""
        conf = app.conf
        warn_unknown_settings(app)
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


#: Setting name -> default; ``docs/api.md``'s settings table is generated from it (``docs/gen_settings.py``).
SETTINGS: dict[str, Any] = {f"delayq_{f.name}": f.default for f in fields(DelayqConfig)}


def _namespace(app: CeleryApp) -> str:
    """The prefix of Django-style settings (``config_from_object(..., namespace='CELERY')``)."""
    return (getattr(app, "namespace", None) or "CELERY").upper()


def unknown_settings(keys: Iterable[str], namespace: str = "CELERY") -> list[tuple[str, str | None]]:
    """``(key, closest valid key or None)`` for every ``delayq_*`` key that is not a setting.

    Recognises the three spellings :meth:`DelayqConfig.from_app` reads:
    ``delayq_x``, ``DELAYQ_X`` and ``<NAMESPACE>_DELAYQ_X``. The suggestion
    is given in the spelling of the key itself. Pure, so it is easy to test.
    """
    valid = [name[len("delayq_"):] for name in SETTINGS]
    ns = f"{namespace.upper()}_DELAYQ_"
    found: list[tuple[str, str | None]] = []
    for key in keys:
        if not isinstance(key, str):
            continue
        if key.startswith("delayq_"):
            head, rest, upper = "delayq_", key[len("delayq_"):], False
        elif key.startswith("DELAYQ_"):
            head, rest, upper = "DELAYQ_", key[len("DELAYQ_"):], True
        elif key.startswith(ns):
            head, rest, upper = ns, key[len(ns):], True
        else:
            continue
        if rest.lower() in valid:
            continue
        close = difflib.get_close_matches(rest.lower(), valid, n=1, cutoff=0.6)
        suggestion = None
        if close:
            suggestion = head + (close[0].upper() if upper else close[0])
        found.append((key, suggestion))
    return found


_WARNED: "weakref.WeakSet[CeleryApp]" = weakref.WeakSet()


def warn_unknown_settings(app: CeleryApp) -> list[tuple[str, str | None]]:
    """Log one warning per unknown ``delayq_*`` setting of ``app``, once per app.

    A misspelt setting (``delayq_enable`` for ``delayq_enabled``) is otherwise
    silently ignored and the default applies, which is hard to notice.
    Returns what was found (empty on later calls for the same app).
    """
    try:
        if app in _WARNED:
            return []
        _WARNED.add(app)
    except TypeError:  # pragma: no cover - an app that cannot be weakly referenced
        pass
    try:
        keys = list(app.conf.keys())
    except Exception:  # pragma: no cover - exotic conf objects
        return []
    found = unknown_settings(keys, _namespace(app))
    for key, suggestion in found:
        hint = f"did you mean {suggestion!r}?" if suggestion else "see celery_delayq.config.SETTINGS for the valid ones."
        log.warning("celery_delayq: unknown setting %r is ignored; %s", key, hint)
    return found


def normalize_queue_backends(value: Any) -> tuple[tuple[str, str], ...]:
    """Sorted ``(queue, backend name)`` pairs from a mapping or pairs; each name as ``delayq_backend`` takes.

    Raises:
        ValueError: a backend that is neither a :data:`BACKEND_ALIASES` name nor a ``"module:Class"`` path.
    """
    items: Iterable[Any] = value.items() if isinstance(value, Mapping) else (value or ())
    out: dict[str, str] = {}
    for name, backend in items:
        if not isinstance(backend, str) or (backend not in BACKEND_ALIASES and ":" not in backend):
            raise ValueError(f"delayq_queue_backends[{name!r}] must be one of {sorted(BACKEND_ALIASES)} or a "
                             f"'module:Class' path, got {backend!r}")
        out[str(name)] = backend
    return tuple(sorted(out.items()))


def normalize_queue_delays(value: Any, spec: LadderSpec) -> tuple[tuple[str, float], ...]:
    """Sorted ``(queue, seconds)`` pairs from a mapping or pairs, validated against the ladder.

    Raises:
        InvalidDelay: a delay that is not a finite, non-negative number of seconds.
        DelayTooLong: a delay the configured ladder cannot hold.
    """
    items: Iterable[Any] = value.items() if isinstance(value, Mapping) else (value or ())
    out: dict[str, float] = {}
    for name, seconds in items:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise InvalidDelay(
                f"delayq_queue_delays[{name!r}] must be a finite number of seconds >= 0, got {seconds!r}")
        spec.units_for(float(seconds))  # DelayTooLong now, not at the first publish
        out[str(name)] = float(seconds)
    return tuple(sorted(out.items()))
