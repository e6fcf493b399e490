"""One configuration object, resolved from Celery's ``app.conf``.

Every setting is an ordinary Celery setting named ``delayq_*``, so it can be set on the app, in a config module,
or in Django settings as ``CELERY_DELAYQ_*`` (with
``app.config_from_object('django.conf:settings', namespace='CELERY')``).

Each value is typed and checked in one place, :data:`CONVERTERS`, run by :class:`DelayqConfig` (and so by
Django's ``manage.py check``, which builds it) and by :func:`setting` for code that reads one setting (the
activation hook reads ``delayq_enabled``), by the rule of :data:`VALUE_RULES`: booleans as Celery reads its own
(so ``delayq_enabled = "false"`` is off), numbers also as strings (settings fed from the environment), names
from the listed values only. Anything else is a :class:`~celery_delayq.errors.SettingsError`, one line naming
the setting, the value (passwords in URLs masked, :func:`mask_url`) and what it takes.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import urllib.parse
import weakref
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Mapping

from celery.utils.serialization import STRTOBOOL_DEFAULT_TABLE

from .errors import DelayTooLong, InvalidDelay, SettingsError
from .ladder.index_layout import IndexLayout
from .ladder.spec import MAX_SHARDS, LadderSpec
from .typing import CeleryApp

__all__ = ["DelayqConfig", "SETTINGS", "FEATURE_SETTINGS", "raw_setting", "SettingsError", "setting", "mask_url", "unknown_settings",
           "warn_unknown_settings", "report_unknown_settings_elsewhere", "normalize_queue_delays",
           "normalize_queue_backends", "BACKEND_ALIASES", "BOOLEAN_FORMS", "CONVERTERS", "VALUE_RULES"]

log = logging.getLogger(__name__)


#: The longest delay accepted without a cap (laps make any length possible; a
#: Celery eta must still be a datetime, and no task waits a century).
LONGEST_DELAY_S = 100 * 365.25 * 86400


#: ``delayq_backend`` names -> ``"module:Class"`` of the backend, as kombu's
#: ``TRANSPORT_ALIASES`` name transports; checked here when the settings are read, built by
#: :func:`celery_delayq.scheduling.backend_named`. A new backend is one module and one row here.
BACKEND_ALIASES: dict[str, str] = {
    "ladder": "celery_delayq.rabbitmq.publisher:LadderPublisher",
    "fixed": "celery_delayq.rabbitmq.fixed:FixedDelays",
    "buckets": "celery_delayq.rabbitmq.buckets:DueBuckets",
    "native": "celery_delayq.rabbitmq.native:NativeDelays",
}


@dataclass(frozen=True)
class DelayqConfig:
    """Resolved settings. The defaults below are the documented defaults.

    Attributes:
        enabled: Route *every* delayed publish of the app through the ladder, not only those of
            :class:`~celery_delayq.DelayedRetryTask` tasks.
        prefix: Namespace of the ladder's exchanges and queues.
        unit_ms: Ladder resolution. 10 ms: each quorum hop costs ~2.5 ms here, so a finer unit buys little
            accuracy for more hops (see README).
        levels: Number of levels; with ``unit_ms=10`` and radix 4, 14 levels hold up to ~31 days while the top
            TTL stays within Erlang's 2^32 ms timers.
        radix: Digit base of the ladder (2 = binary; 4 measured twice as fast at saturation with fewer hops, see
            README "Design trade-offs").
        shards: Parallel copies of the ladder's levels; each task takes the one its id hashes to, so tasks due
            together spread over that many times the queues, dead-letter workers and (on a cluster) leader
            nodes. It pays only where one queue's dead-letter worker is the limit and the broker has idle cores;
            measured on 2 cores it does not (README "Sharded ladders"). 1 = unsharded.
        queue_type: ``auto`` (quorum where the broker supports TTL on it, else classic), ``quorum`` or
            ``classic``.
        declare: Declare the ladder (idempotent). ``False`` = verify only.
        confirm_timeout: Seconds to wait for a publisher confirm.
        batch_window: Unconfirmed messages allowed in flight inside :func:`~celery_delayq.batch` before the
            publisher waits.
        broker_url: Broker for the ladder; default is the app's write broker.
        management_url: RabbitMQ's management API, for what AMQP cannot tell (bindings, held messages, leaders,
            and on RabbitMQ 3.x whether a new ladder fits the broker's file handles; without it a new ladder
            there is created only by ``delayq topology declare``). ``None`` = ``http://<broker host>:15672``;
            ``""`` = never ask it. The API is asked with the broker connection's user and password, or with
            those in the URL when it has them (``http://monitor:secret@host:15672``, percent-encoded): the
            ``monitoring`` tag reads all it needs, and recovery after a broker restart sets a policy
            (``policymaker``). The password is never printed or logged.
        telemetry_dir: Root directory of the JSON Lines telemetry (``None`` = off);
            ``python -m celery_delayq.analytics`` turns it into a report.
        queue_delays: Default delay in seconds per destination queue name, e.g. ``{"slow": 30}``. Tasks sent
            there without a countdown or eta wait that long; their own countdown/eta wins. Stored as sorted
            ``(name, seconds)`` pairs so the config stays hashable.
        park: Move messages whose retries are exhausted to a parking queue.
        parking_queue: Name of the parking queue; ``None`` = ``<prefix>.parking``.
        parking_queue_type: ``auto`` (the ladder's queue type), ``quorum`` or ``classic``.
        park_on: Exception types (or ``"module.Name"`` strings) that park a message at once instead of failing
            it or retrying it.
        retry_policy: App-wide :class:`~celery_delayq.policies.RetryPolicy` or ``tenacity.Retrying`` for
            DelayedRetryTask tasks without their own.
        max_delay: When set, the longest delay accepted anywhere: a longer countdown or eta raises
            ``DelayTooLong``, and an explicit delay (:class:`~celery_delayq.policies.RetryAfter`) is capped to
            it. Unset, delays longer than the ladder make laps through it (years are fine), and a RetryAfter is
            capped by the task's ``retry_backoff_max`` (Celery's default 600 s).
        dedup: Run a second delivery of the same (task id, attempt) zero times (state in Redis at
            ``dedup_url``); see the README, "The duplicate guard".
        dedup_url: Redis URL of the duplicate guard.
        dedup_ttl: Seconds a delivery is remembered by the duplicate guard.
        index: Keep an index of waiting tasks (RabbitMQ streams written by the broker itself, see
            :mod:`celery_delayq.pending`) for ``delayq pending`` and ``delayq cancel``; the broker writes one
            extra copy per ladder pass.
        leader_placement: ``spread`` (the leaders of every queue a new ladder owns, its exit and parking queues
            too, are spread over the cluster's running nodes, through a connection to each, which needs the
            management API to list them) or ``broker`` (wherever the broker's queue-leader locator puts them;
            with its default, ``client-local``, all on the declaring process's node). Existing queues never
            move; see :mod:`celery_delayq.rabbitmq.placement`.
        metrics_port: Serve Prometheus metrics (:mod:`celery_delayq.telemetry.metrics`) on this port from each
            worker's main process (``None`` = off). With the prefork pool, retries and parks happen in the
            children and are not counted there.
        backend: Where delayed messages wait: a name of :data:`BACKEND_ALIASES` or a ``"module:Class"`` path to
            a :class:`~celery_delayq.typing.DelayBackend` with a ``for_connection(connection, config)`` class
            method. ``buckets`` (the default): the TTL-queue ladder, and for a due second that this process
            fills with more than ``delayq_bucket_after`` tasks of one destination, each at least
            ``delayq_bucket_min_delay`` ahead, queues of that second, one hop
            (:mod:`celery_delayq.rabbitmq.buckets`); ``ladder``: the ladder alone; ``fixed``: one TTL queue per
            destination and distinct delay, one hop, for apps whose delays take a few fixed values
            (:mod:`celery_delayq.rabbitmq.fixed`). The delay check, the ``before_schedule`` and
            ``message_scheduled`` signals and the index entry that ``pending`` and ``cancel`` read are done once
            above every backend (:mod:`celery_delayq.scheduling`).
        queue_backends: Backend per destination queue name, e.g. ``{"emails": "fixed"}`` (names as for
            ``backend``); other queues use ``backend``. Stored as sorted pairs.
        fixed_resolution: Seconds a ``fixed`` queue's delay is rounded *up* to (never early; a message may
            arrive up to this much late), so delays that differ by noise share one queue.
        fixed_max_delay: The longest delay a ``fixed`` queue holds; a longer one goes through the ladder.
        fixed_queues: The most ``fixed`` queues (destination and delay) one process declares; a new delay beyond
            them goes through the ladder (logged once). On RabbitMQ 3.x each new queue must also fit the
            broker's file-handle budget (:mod:`celery_delayq.rabbitmq.budget`).
        bucket_width: Seconds of due time one ``buckets`` queue gathers: a due time is rounded *up* to the end of
            its slice (never early; a message may arrive up to this much late).
        bucket_max_delay: The longest delay a ``buckets`` queue holds; a longer one goes through the ladder.
        bucket_queues: The most ``buckets`` queues one process keeps alive (each lives until its lease ends,
            ``delayq_bucket_grace`` after its slice at the latest plus five minutes); a new one beyond them goes
            through the ladder (logged once). ``None``: 64 on RabbitMQ 3.x, where each must also fit the
            file-handle budget, and 512 on 4.x, which reserves no file handles per queue.
        bucket_grace: Seconds a ``buckets`` queue is kept after its slice ends before the broker may delete it
            (``x-expires``): its messages must have been dead-lettered by then, so keep it well above the time a
            burst takes to drain.
        bucket_shards: Queues each due slice of a destination is spread over (round robin per process), so the
            broker dead-letters a large burst from several queues at once. ``None``: 4 on RabbitMQ 3.x (each
            reserves file handles), 8 on 4.x.
        bucket_after: Messages toward one destination and due slice that one process sends through the ladder
            before the slice gets ``buckets`` queues: a delay that comes due alone keeps the ladder's precision
            (``delayq_unit_ms``) and costs no queue of its own, work that comes due together takes one hop (0:
            every delay that fits).
        bucket_min_delay: Seconds below which a delay takes the ladder, with its precision: a bucket may be up
            to ``delayq_bucket_width`` late, a small share only of a long delay. Unless the app repeats it
            (``delayq_recurring_after``).
        recurring_after: Times one process sends the same delay (to the ladder's unit, up to
            ``delayq_bucket_max_delay``) toward one destination within a ten-minute window before the rest of the
            window's take a queue of that delay: one hop, the ladder's precision, for a fixed ``countdown`` or a
            retry's backoff step (``buckets`` backend; 0: never). A long one takes it instead of a due-time
            bucket: steady traffic with one countdown then keeps one queue per window and shard, not a set per
            second. At most four such delays per process and window. Its queues count toward
            ``delayq_bucket_queues``.
        metrics_address: The address the metrics exporter binds (``delayq_metrics_port`` and
            ``delayq metrics``). Loopback by default, so the metrics are not served to the network unless asked:
            ``0.0.0.0`` (every IPv4 interface), ``::`` or one interface's address is that explicit choice.
        previous_shapes: Shapes (``"LEVELSxRADIX"``, e.g. ``["14x4"]``) this app's ladder had before its
            ``levels``/``radix`` changed. Tasks published before the change wait in that ladder until due (a
            reshaped ladder is a new one beside it); ``pending``, ``cancel``, the page and the workers' cancels
            read its index and cancel log too, until ``delayq topology delete --shape LEVELSxRADIX`` removes it
            once drained (``docs/operations.md``, "Changing the ladder's shape").
        disabled_extensions: Names of built-in extensions to leave out of the app
            (:data:`celery_delayq.glue.extensions.EXTENSIONS`: ``takeover``, ``cancels``, ``parking``,
            ``telemetry``, ``metrics``), e.g. ``["takeover"]`` for workers that must not move other publishers'
            delayed tasks. ``delayq doctor`` lists those active.
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
    queue_delays: tuple[tuple[str, float], ...] = ()
    park: bool = True
    parking_queue: str | None = None
    parking_queue_type: str = "auto"
    park_on: tuple[type[BaseException] | str, ...] = ()
    retry_policy: object = None
    max_delay: float | None = None
    dedup: bool = False
    dedup_url: str = "redis://localhost:6379/0"
    dedup_ttl: float = 86400.0
    index: bool = True
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    disabled_extensions: tuple[str, ...] = ()
    leader_placement: str = "spread"
    backend: str = "buckets"
    queue_backends: tuple[tuple[str, str], ...] = ()
    fixed_resolution: float = 1.0
    fixed_max_delay: float = 600.0
    fixed_queues: int = 16
    bucket_width: float = 1.0
    bucket_max_delay: float = 600.0
    bucket_queues: int | None = None
    bucket_grace: float = 900.0
    bucket_shards: int | None = None
    bucket_after: int = 100
    bucket_min_delay: float = 30.0
    recurring_after: int = 100
    previous_shapes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        """Type and validate every field: the one place settings are checked (see :data:`CONVERTERS`).

        Runs for :meth:`from_app` and for a config built directly alike, so
        ``DelayqConfig(enabled="false").enabled is False``. Raises :class:`~celery_delayq.errors.SettingsError`
        naming the setting, the value and what it takes.
        """
        for f in fields(self):
            value = getattr(self, f.name)
            converted = CONVERTERS[f.name](value)
            if converted is not value:
                object.__setattr__(self, f.name, converted)
        try:
            spec = self.spec
        except ValueError as exc:  # each number fits alone, but not the ladder they make together
            raise SettingsError(f"delayq_prefix/unit_ms/levels/radix/shards do not make a usable ladder: {exc}") from exc
        # Settings arrive as dicts and lists; the config is a dict key of the
        # process-wide publisher registry, so keep every field hashable.
        object.__setattr__(self, "queue_delays", normalize_queue_delays(self.queue_delays, spec))

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

    @property
    def layout(self) -> IndexLayout:
        """The index and cancel-log layout readers use: this ladder's, with those of :attr:`previous_shapes`."""
        return IndexLayout(self.spec, index=self.index,
                           previous=tuple(IndexLayout(spec, index=self.index) for spec in self.previous_specs))

    @property
    def previous_specs(self) -> tuple[LadderSpec, ...]:
        """The ladders of :attr:`previous_shapes` (the current shape left out): their index and cancel log are read."""
        return tuple(LadderSpec(prefix=self.prefix, unit_ms=self.unit_ms, levels=levels, radix=radix)
                     for levels, radix in self.previous_shapes if (levels, radix) != (self.levels, self.radix))

    @property
    def parking_queue_name(self) -> str:
        """The parking queue: ``delayq_parking_queue``, else ``<prefix>.parking``."""
        return self.parking_queue or f"{self.prefix}.parking"

    @classmethod
    def from_app(cls, app: CeleryApp) -> "DelayqConfig":
        """Read ``delayq_*`` settings from a Celery app (Django's ``CELERY_DELAYQ_*`` too)."""
        conf = app.conf
        warn_unknown_settings(app)
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = raw_setting(conf, f"delayq_{f.name}")
            if value is not None:
                values[f.name] = value
        return cls(**values)


def raw_setting(conf: Any, key: str) -> Any:
    """``key`` (``delayq_web_token``) of ``conf`` as given, in any of the three spellings
    (``delayq_x``, ``DELAYQ_X``, Django's ``CELERY_DELAYQ_X``); ``None`` when unset.
    For the features that type their own settings (:data:`FEATURE_SETTINGS`)."""
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


def _lookup(conf: Any, key: str) -> Any:
    """The ``delayq_*`` setting ``key`` of ``conf``, typed and validated as :class:`DelayqConfig` does.

    ``None`` when it is not set. Callers that read one setting without building the whole config (the activation
    hook reads ``delayq_enabled``) get the same answer as the config: ``"false"`` is ``False``, ``"yes please"``
    is a :class:`~celery_delayq.errors.SettingsError`. A key that is no setting is returned as given.
    """
    value = raw_setting(conf, key)
    name = key[len("delayq_"):] if key.startswith("delayq_") else key
    if value is None or name not in CONVERTERS:
        return value
    return CONVERTERS[name](value)


def setting(app: CeleryApp, name: str) -> Any:
    """One setting of ``app`` (``"enabled"`` or ``"delayq_enabled"``), typed and validated; its default when unset.

    The same conversion as :meth:`DelayqConfig.from_app` (:data:`CONVERTERS`),
    for code that needs one setting before the whole config can be built.
    """
    field_name = name[len("delayq_"):] if name.startswith("delayq_") else name
    if field_name not in CONVERTERS:
        raise KeyError(f"{name!r} is not a celery_delayq setting; see celery_delayq.config.SETTINGS")
    value = _lookup(app.conf, f"delayq_{field_name}")
    return SETTINGS[f"delayq_{field_name}"] if value is None else value


# -- typing and validating each setting (the one place; Django's checks run it through from_app) ----------
#: How values are read, for the documentation (``docs/gen_settings.py`` prints it above the settings table).
VALUE_RULES = (
    "Values are checked when the settings are read, by the same code at run time and in Django's "
    "`manage.py check`. Booleans take exactly Celery's own forms for its boolean settings: `true`/`false`, "
    "`yes`/`no`, `on`/`off`, `1`/`0` (any case), a bool, or the integers 1 and 0 (so `\"false\"` is off). "
    "Numbers take a number or a string of one (`\"10\"`, as Celery reads its own numeric settings from text), "
    "finite and in range. Names take the listed values. Anything else stops with a `SettingsError` naming the "
    "setting, the value and what it takes. A password in a URL setting is never printed or logged.")

#: The spellings ``delayq_*`` booleans accept: exactly Celery's own for its boolean settings
#: (``celery.utils.serialization.strtobool``'s table, any case), plus ``True``/``False`` and ``1``/``0``.
BOOLEAN_FORMS = "true/false, yes/no, on/off, 1/0 (any case) or a Python bool"


def mask_url(url: Any) -> str:
    """``url`` with any password replaced by ``**`` (``amqp://user:**@host//``), for printing and logging.

    A ``;``-separated list of broker URLs is masked URL by URL. Anything that is no URL is returned as a string,
    unchanged. Unlike kombu's ``maybe_sanitize_url`` (same ``**`` mask) it leaves the rest of the URL as written
    (kombu normalises ``/%2F`` to ``//`` and masks only the first of a list).
    """
    if not isinstance(url, str):
        return repr(url) if url is not None else "None"
    return ";".join(_mask_one(part) for part in url.split(";"))


def _mask_one(url: str) -> str:
    # String surgery rather than urlsplit: it must also mask what is no valid URL
    # (a port that is not a number, a missing scheme: "user:pw@host:15672").
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    authority, slash, tail = rest.partition("/")
    user_info, at, host = authority.rpartition("@")
    if not at or ":" not in user_info:
        return url
    return f"{head}{sep}{user_info.split(':', 1)[0]}:**@{host}{slash}{tail}"


def _refuse(name: str, value: Any, wants: str, *, url: bool = False) -> SettingsError:
    shown = repr(mask_url(value)) if url and isinstance(value, str) else repr(value)
    return SettingsError(f"delayq_{name} must be {wants}, got {shown}", setting=f"delayq_{name}")


def _boolean(name: str) -> Callable[[Any], bool]:
    def convert(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in STRTOBOOL_DEFAULT_TABLE:
            return bool(STRTOBOOL_DEFAULT_TABLE[value.lower()])
        raise _refuse(name, value, f"a boolean ({BOOLEAN_FORMS})")
    return convert


def _number(name: str, *, integer: bool, low: float, high: float | None = None, low_open: bool = False,
            optional: bool = False, unit: str = "") -> Callable[[Any], Any]:
    """A converter for a numeric setting in ``[low, high]`` (``(low, high]`` with ``low_open``).

    A string is read with ``int()``/``float()``, as Celery reads its own numeric
    settings from text (``celery worker -- ...``, environment-fed Django settings);
    a bool, NaN, an infinity, a fraction for an integer setting, or anything out of range is refused.
    """
    kind = "an integer" if integer else "a finite number"
    if high is not None:
        span = f"from {low:g} to {high:g}" if not low_open else f"above {low:g} and at most {high:g}"
    else:
        span = f"above {low:g}" if low_open else f"{low:g} or more"
    wants = f"{kind} {span}{f' ({unit})' if unit else ''}" + (" or None" if optional else "")

    def convert(value: Any) -> Any:
        if value is None and optional:
            return None
        number: Any = value
        if isinstance(value, str):
            try:
                number = int(value) if integer else float(value)
            except ValueError:
                raise _refuse(name, value, wants) from None
        if isinstance(number, bool) or not isinstance(number, int if integer else (int, float)):
            raise _refuse(name, value, wants)
        if not integer:
            number = float(number)
        if (not integer and not math.isfinite(number)) or number < low or (low_open and number == low) or \
                (high is not None and number > high):
            raise _refuse(name, value, wants)
        return number
    return convert


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        raise _refuse(name, value, "one of " + ", ".join(repr(c) for c in choices))
    return convert


def _text(name: str, *, optional: bool = False, empty: bool = False, url: bool = False,
          path: bool = False) -> Callable[[Any], Any]:
    wants = ("a path" if path else "a URL" if url else "a string") + (" (not empty)" if not empty else "") + \
        (" or None" if optional else "")

    def convert(value: Any) -> Any:
        if value is None and optional:
            return None
        if path and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or (not empty and not value):
            raise _refuse(name, value, wants, url=url)
        return value
    return convert


def _management_url(value: Any) -> str | None:
    """``None`` (guess ``http://<broker host>:15672``), ``""`` (off), or an http(s) URL with a host.

    Credentials in it (``http://user:password@host:15672``) are the ones the API is asked with
    (:class:`~celery_delayq.rabbitmq.management.ManagementAPI`); they are never printed.
    """
    wants = "an http:// or https:// URL of RabbitMQ's management API (e.g. 'http://HOST:15672'), '' (off) or None"
    if value is None or value == "":
        return value  # type: ignore[no-any-return]
    if not isinstance(value, str):
        raise _refuse("management_url", value, wants)
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise _refuse("management_url", value, wants, url=True) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _refuse("management_url", value, wants, url=True)
    return value


def _backend(value: Any) -> str:
    if isinstance(value, str) and (value in BACKEND_ALIASES or ":" in value):
        return value
    raise _refuse("backend", value, f"one of {sorted(BACKEND_ALIASES)} or a 'module:Class' path")


#: The names of :data:`celery_delayq.glue.extensions.EXTENSIONS`, for ``delayq_disabled_extensions``
#: (written here because the glue imports this module; ``tests/test_config.py`` checks they agree).
EXTENSION_NAMES: tuple[str, ...] = ("takeover", "cancels", "parking", "telemetry", "metrics")


def _extensions(value: Any) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else value
    if names is None or names == ():
        return ()
    if not isinstance(names, (list, tuple, set, frozenset)) or \
            not all(isinstance(n, str) and n in EXTENSION_NAMES for n in names):
        raise _refuse("disabled_extensions", value, f"a name or a list of names from {list(EXTENSION_NAMES)}")
    return tuple(names)


def _park_on(value: Any) -> tuple[type[BaseException] | str, ...]:
    items = value if isinstance(value, (list, tuple, set, frozenset)) else (value,) if value else ()
    for item in items:
        # Strings are imported when a task first needs them (an import here could be circular).
        if not ((isinstance(item, str) and item) or (isinstance(item, type) and issubclass(item, BaseException))):
            raise _refuse("park_on", value, "exception classes or 'module.Name' strings (one or a list)")
    return tuple(items)


def _shapes(value: Any) -> tuple[tuple[int, int], ...]:
    """``delayq_previous_shapes``: ``"14x4"``, ``[14, 4]`` or a list of either, as ``((levels, radix), ...)``."""
    wants = "ladder shapes as 'LEVELSxRADIX' strings (e.g. ['14x4']), each with levels >= 1 and radix 2-36"
    if value is None or value == () or value == []:
        return ()
    items = [value] if isinstance(value, str) or (
        isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value)) else value
    if not isinstance(items, (list, tuple)):
        raise _refuse("previous_shapes", value, wants)
    out: list[tuple[int, int]] = []
    for item in items:
        shape: Any = item
        if isinstance(item, str):
            levels_text, sep, radix_text = item.strip().lower().partition("x")
            if not sep or not levels_text.isdigit() or not radix_text.isdigit():
                raise _refuse("previous_shapes", value, wants)
            shape = (int(levels_text), int(radix_text))
        if (not isinstance(shape, (list, tuple)) or len(shape) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in shape)
                or shape[0] < 1 or not 2 <= shape[1] <= 36):
            raise _refuse("previous_shapes", value, wants)
        if tuple(shape) not in out:
            out.append((int(shape[0]), int(shape[1])))
    return tuple(out)


_QUEUE_TYPES = ("auto", "quorum", "classic")

#: Field name -> the function that types and validates its value (``None`` where the field allows it).
#: :meth:`DelayqConfig.__post_init__` runs each; :func:`_lookup` and :func:`setting` run one.
CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "enabled": _boolean("enabled"),
    "prefix": _text("prefix"),
    "unit_ms": _number("unit_ms", integer=True, low=1, unit="milliseconds"),
    "levels": _number("levels", integer=True, low=1),
    "radix": _number("radix", integer=True, low=2, high=36),
    "shards": _number("shards", integer=True, low=1, high=MAX_SHARDS),
    "queue_type": _choice("queue_type", _QUEUE_TYPES),
    "declare": _boolean("declare"),
    "confirm_timeout": _number("confirm_timeout", integer=False, low=0, low_open=True, unit="seconds"),
    "batch_window": _number("batch_window", integer=True, low=1, unit="messages"),
    "broker_url": _text("broker_url", optional=True, url=True),
    "telemetry_dir": _text("telemetry_dir", optional=True, path=True),
    "management_url": _management_url,
    "queue_delays": lambda v: v,  # checked against the ladder in __post_init__ (normalize_queue_delays)
    "park": _boolean("park"),
    "parking_queue": _text("parking_queue", optional=True),
    "parking_queue_type": _choice("parking_queue_type", _QUEUE_TYPES),
    "park_on": _park_on,
    "retry_policy": lambda v: v,  # any policy object: RetryPolicy.coerce checks it where it is used
    "max_delay": _number("max_delay", integer=False, low=0, low_open=True, optional=True, unit="seconds"),
    "dedup": _boolean("dedup"),
    "dedup_url": _text("dedup_url", url=True),
    "dedup_ttl": _number("dedup_ttl", integer=False, low=0, low_open=True, unit="seconds"),
    "index": _boolean("index"),
    "metrics_port": _number("metrics_port", integer=True, low=1, high=65535, optional=True),
    "metrics_address": _text("metrics_address"),
    "disabled_extensions": _extensions,
    "leader_placement": _choice("leader_placement", ("spread", "broker")),
    "backend": _backend,
    "queue_backends": lambda v: normalize_queue_backends(v),
    "fixed_resolution": _number("fixed_resolution", integer=False, low=0, low_open=True, unit="seconds"),
    "fixed_max_delay": _number("fixed_max_delay", integer=False, low=0, low_open=True, unit="seconds"),
    "fixed_queues": _number("fixed_queues", integer=True, low=0),
    "bucket_width": _number("bucket_width", integer=False, low=0.001, unit="seconds"),
    "bucket_max_delay": _number("bucket_max_delay", integer=False, low=0, low_open=True, unit="seconds"),
    "bucket_queues": _number("bucket_queues", integer=True, low=0, optional=True),
    "bucket_grace": _number("bucket_grace", integer=False, low=1, unit="seconds"),
    "bucket_shards": _number("bucket_shards", integer=True, low=1, high=64, optional=True),
    "bucket_after": _number("bucket_after", integer=True, low=0),
    "bucket_min_delay": _number("bucket_min_delay", integer=False, low=0, unit="seconds"),
    "recurring_after": _number("recurring_after", integer=True, low=0),
    "previous_shapes": lambda v: _shapes(v),
}


#: Setting name -> default; ``docs/api.md``'s settings table is generated from it (``docs/gen_settings.py``).
SETTINGS: dict[str, Any] = {f"delayq_{f.name}": f.default for f in fields(DelayqConfig)}
#: Settings a feature reads itself rather than through :class:`DelayqConfig` (the web page's
#: ``delayq_web_*``, :class:`celery_delayq.web.settings.WebSettings`): known, so never warned
#: about as a typo. ``tests/web`` checks the page reads exactly these.
FEATURE_SETTINGS: tuple[str, ...] = ("delayq_web_token", "delayq_web_username", "delayq_web_password",
                                     "delayq_web_body_max", "delayq_web_page_max", "delayq_web_body_limit")


def _namespace(app: CeleryApp) -> str:
    """The prefix of Django-style settings (``config_from_object(..., namespace='CELERY')``)."""
    return (getattr(app, "namespace", None) or "CELERY").upper()


def unknown_settings(keys: Iterable[str], namespace: str = "CELERY") -> list[tuple[str, str | None]]:
    """``(key, closest valid key or None)`` for every ``delayq_*`` key that is not a setting.

    Recognises the three spellings :meth:`DelayqConfig.from_app` reads:
    ``delayq_x``, ``DELAYQ_X`` and ``<NAMESPACE>_DELAYQ_X``. The suggestion
    is given in the spelling of the key itself. Pure, so it is easy to test.
    """
    valid = [name[len("delayq_"):] for name in (*SETTINGS, *FEATURE_SETTINGS)]
    ns = f"{namespace.upper()}_DELAYQ_"
    found: list[tuple[str, str | None]] = []
    for key in keys:
        if not isinstance(key, str):
            continue
        head = next((h for h in ("delayq_", "DELAYQ_", ns) if key.startswith(h)), None)
        if head is None or key[len(head):].lower() in valid:
            continue
        close = difflib.get_close_matches(key[len(head):].lower(), valid, n=1, cutoff=0.6)
        found.append((key, head + (close[0] if head == "delayq_" else close[0].upper()) if close else None))
    return found


_WARNED: "weakref.WeakSet[CeleryApp]" = weakref.WeakSet()


def report_unknown_settings_elsewhere(app: CeleryApp) -> None:
    """Do not log ``app``'s unknown settings: another reporter lists them (Django's checks, W002/W003).

    Without this a Django project saw each typo twice: once logged, once as a check finding.
    """
    try:
        _WARNED.add(app)
    except TypeError:  # pragma: no cover - an app that cannot be weakly referenced
        pass


def warn_unknown_settings(app: CeleryApp) -> list[tuple[str, str | None]]:
    """Log one warning per unknown ``delayq_*`` setting of ``app``, once per app.

    A misspelt setting (``delayq_enable`` for ``delayq_enabled``) is otherwise silently ignored and the default
    applies, which is hard to notice. Returns what was found (empty on later calls for the same app).
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


def _pairs(name: str, value: Any, wants: str) -> list[tuple[Any, Any]]:
    """``(key, value)`` pairs of a mapping setting given as a mapping or as pairs; refused otherwise."""
    if isinstance(value, Mapping):
        return list(value.items())
    if not value:
        return []
    if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        return [(k, v) for k, v in value]
    raise _refuse(name, value, wants)


def normalize_queue_backends(value: Any) -> tuple[tuple[str, str], ...]:
    """Sorted ``(queue, backend name)`` pairs from a mapping or pairs; each name as ``delayq_backend`` takes.

    Raises:
        SettingsError: not a mapping, or a backend that is neither a :data:`BACKEND_ALIASES` name
            nor a ``"module:Class"`` path.
    """
    out: dict[str, str] = {}
    for name, backend in _pairs("queue_backends", value, "a mapping of queue name to backend name"):
        if not isinstance(backend, str) or (backend not in BACKEND_ALIASES and ":" not in backend):
            raise SettingsError(f"delayq_queue_backends[{name!r}] must be one of {sorted(BACKEND_ALIASES)} or a "
                             f"'module:Class' path, got {backend!r}")
        out[str(name)] = backend
    return tuple(sorted(out.items()))


def normalize_queue_delays(value: Any, spec: LadderSpec) -> tuple[tuple[str, float], ...]:
    """Sorted ``(queue, seconds)`` pairs from a mapping or pairs, validated against the ladder.

    Raises:
        InvalidDelay: a delay that is not a finite, non-negative number of seconds.
        DelayTooLong: a delay the configured ladder cannot hold.
    """
    out: dict[str, float] = {}
    for name, seconds in _pairs("queue_delays", value, "a mapping of queue name to seconds, e.g. {'slow': 30}"):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise InvalidDelay(
                f"delayq_queue_delays[{name!r}] must be a finite number of seconds >= 0, got {seconds!r}")
        spec.units_for(float(seconds))  # DelayTooLong now, not at the first publish
        out[str(name)] = float(seconds)
    return tuple(sorted(out.items()))
