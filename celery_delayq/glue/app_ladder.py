"""One Celery app's ladder: its settings, its publisher, and which publishes it delays.

:meth:`AppLadder.divert` answers the kombu hook from the headers alone, with no I/O: is a
publish delayed, until when, and where would it have gone (undoing Celery's native delayed
delivery, so a task passes through one ladder once). It decides *when*, never which queue.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, ContextManager, Iterable

from kombu import Exchange
from kombu.connection import Connection

from ..ladder import headers as H
from ..config import DelayqConfig
from ..ladder.delays import parse_eta
from ..ladder.index_layout import IndexLayout
from ..ladder.spec import check_name
from ..rabbitmq import client
from ..rabbitmq.management import ManagementAPI, key_matches
from ..rabbitmq.confirms import dedicated_copy
from ..ladder.plugin_compat import DELAY_HEADER, delay_of, plain_entities
from ..rabbitmq.publisher import LadderPublisher, publisher_for, topology_for
from ..scheduling import Scheduler
from ..rabbitmq.topology import Topology
from .extensions import Extensions
from .queue_delays import default_delay, queue_delays_of
from ..typing import CeleryApp, DelayBackend, Diversion

__all__ = ["AppLadder", "ladder_for", "index_of", "batch", "ladder_if_any", "forget_ladder", "refresh_ladder", "native_unwrap",
           "exchange_name"]

#: Celery's native ladder: 28 levels, top exchange ``[prefix_]celery_delayed_27``.
_NATIVE_TOP = re.compile(r"^(?:(?P<prefix>.+)_)?celery_delayed_27$")
_NATIVE_BITS = 28


def native_unwrap(exchange: str, routing_key: str) -> tuple[str, str] | None:
    """``(native delivery exchange, original routing key)`` of a native-ladder publish, else None."""
    m = _NATIVE_TOP.match(exchange or "")
    if not m:
        return None
    words = (routing_key or "").split(".")
    if len(words) <= _NATIVE_BITS or any(w not in ("0", "1") for w in words[:_NATIVE_BITS]):
        return None
    prefix = m.group("prefix")
    delivery = f"{prefix}_celery_delayed_delivery" if prefix else "celery_delayed_delivery"
    return delivery, ".".join(words[_NATIVE_BITS:])


def exchange_name(exchange: Any) -> str:
    """The name of a kombu ``Exchange`` or of an exchange given by name (``""`` = default)."""
    return exchange.name if isinstance(exchange, Exchange) else (exchange or "")


class AppLadder:
    """The ladder of one Celery app: settings, publisher, and the per-publish decision.

    Get it with :func:`celery_delayq.ladder_for` (no side effects) or
    :func:`celery_delayq.install` (which also makes the app's producers ask it).
    """

    def __init__(self, app: CeleryApp, config: DelayqConfig | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self._config = config
        self.clock = clock
        #: Names of tasks delayed through the ladder even when ``delayq_enabled`` is off
        #: (the :class:`~celery_delayq.DelayedRetryTask` tasks of the app).
        self.tasks: set[str] = set()
        self._publisher: LadderPublisher | None = None
        self._scheduler: Scheduler | None = None
        self._queue_delays: dict[str, float] | None = None
        #: The app's active extensions by name (:mod:`celery_delayq.glue.extensions`); each keeps
        #: its state for the app on itself. Filled by :func:`celery_delayq.install`.
        self.extensions: Extensions[AppLadder] = Extensions()
        #: Set by :func:`celery_delayq.install`: the app's producers ask this ladder.
        self.installed = False

    def __repr__(self) -> str:
        return f"<AppLadder {self.config.prefix!r} of {getattr(self.app, 'main', None)!r}>"

    @property
    def config(self) -> DelayqConfig:
        """Settings, read from ``app.conf`` on first use (so Django settings are loaded)."""
        if self._config is None:
            self._config = DelayqConfig.from_app(self.app)
        return self._config

    def connection(self) -> Connection:
        """A (not yet connected) kombu connection to the ladder's broker."""
        return self.app.connection_for_write(self.config.broker_url or None)  # None: the app's write broker

    def dedicated_connection(self, role: str) -> Connection:
        """A (not yet connected) connection of the ladder's own for ``role``: the app's options, never ``confirm_publish``."""
        return dedicated_copy(self.connection(), role)

    # -- the read side: what commands, the page and the metrics read (nothing declared, no hook) --
    @property
    def uri(self) -> str:
        """The broker URL with the password masked, for messages."""
        return str(self.connection().as_uri())

    def connected(self) -> ContextManager[client.Connection]:
        """A connected py-amqp connection to the ladder's broker, closed afterwards (one try, no back-off)."""
        return client.connected(self.connection())

    def topology(self, raw: client.Connection) -> Topology:
        """The app's ladder as the broker behind ``raw`` would have it (nothing is declared).

        An operator's command is the explicit way to create a ladder the budget check cannot see.
        """
        return topology_for(self.connection(), self.config, raw, explicit=True, route_check=False)

    def api(self, raw: client.Connection) -> ManagementAPI | None:
        """The management API of the broker behind ``raw`` (``None`` when switched off)."""
        return ManagementAPI.for_broker(self.connection(), raw, self.config.management_url)

    @property
    def publisher(self) -> LadderPublisher:
        """The process-wide ladder publisher for this app's broker and settings."""
        if self._publisher is None:
            self._publisher = publisher_for(self.connection(), self.config)
        return self._publisher

    @property
    def backend(self) -> DelayBackend:
        """The app's :class:`~celery_delayq.typing.DelayBackend` (``delayq_backend``)."""
        return self.scheduler.default

    @property
    def scheduler(self) -> Scheduler:
        """The one place above the backends (delay check, signals, index), which the producer asks."""
        if self._scheduler is None:
            self._scheduler = Scheduler.for_connection(self.connection(), self.config, clock=self.clock)
        return self._scheduler

    @property
    def queue_delays(self) -> dict[str, float]:
        """Queue name -> default delay (``delayq_queue_delays`` and ``DelayedQueue``s); often empty."""
        if self._queue_delays is None:
            self._queue_delays = queue_delays_of(self.app, self.config.queue_delays)
        return self._queue_delays

    @functools.cached_property
    def native_delayed_delivery(self) -> bool:
        """Would Celery (5.5+) rewrite this app's delayed publishes to its own native ladder? (Asked once: costly.)"""
        try:
            from celery.utils.quorum_queues import detect_quorum_queues
        except ImportError:  # Celery < 5.5 has no native delayed delivery
            return False
        try:
            driver = self.app.connection_for_write().transport.driver_type
        except Exception:  # pragma: no cover - no transport, no native delivery
            return False
        return bool(detect_quorum_queues(self.app, driver)[0])

    def reread(self) -> None:
        """Read the app's settings again, in place, if they were read; keep what did not change."""
        if self._config is None:
            return
        fresh = DelayqConfig.from_app(self.app)
        if fresh != self._config:
            self._config, self._publisher, self._scheduler, self._queue_delays = fresh, None, None, None

    def wants(self, headers: dict[str, Any]) -> bool:
        """Does this task's delay belong in the ladder (``delayq_enabled``, or a ladder task)?"""
        return self.config.enabled or headers.get("task") in self.tasks

    # -- the one question the producer asks ------------------------------------------
    def divert(self, headers: dict[str, Any], exchange: Any, routing_key: str | None,
               declare: Iterable[Any]) -> Diversion | None:
        """Where and when a publish must arrive, or ``None`` to publish it unchanged.

        Delayed: a future ``eta`` or ``x-delayq-due`` of a task that belongs in the ladder, or an
        undelayed publish to a queue with a default delay (``delayq_queue_delays``).

        Raises:
            InvalidDelay: an eta that is not a point in time.
            InvalidName: an exchange, routing key or queue name RabbitMQ would refuse.
        """
        eta = headers.get("eta")
        if eta is None and H.DUE not in headers:
            if DELAY_HEADER in headers:  # code written for the delayed-message plugin
                return self._plugin_delay(headers, exchange, routing_key, declare)
            delays = self.queue_delays
            if not delays:
                return None  # the common case: an undelayed publish, no queue defaults
            name, key = exchange_name(exchange), routing_key or ""
            delay = default_delay(delays, name, key, declare)
            if delay is None:
                return None
            due = self.clock() + delay
        elif not self.wants(headers):
            H.forget_pass(headers)
            return None
        else:
            name, key = exchange_name(exchange), routing_key or ""
            # Celery's eta wins: a retry may still carry the previous pass's x-delayq-due.
            due = parse_eta(eta) if eta is not None else float(headers[H.DUE])

        native = native_unwrap(name, key)
        if native is not None:
            name, key = self._native_destination(*native, native_key=key)
        now = self.clock()
        if due <= now:
            H.forget_pass(headers)
            return None if native is None else Diversion(name, key)

        queue_hint = _check_names(name, key, declare)
        if headers.get("eta") is None:  # request.eta right; a worker holds an early arrival
            headers["eta"] = datetime.fromtimestamp(due, tz=timezone.utc).isoformat()
        return Diversion(name, key, due=due, delay=due - now, queue_hint=queue_hint)

    def _plugin_delay(self, headers: dict[str, Any], exchange: Any, routing_key: str | None,
                      declare: Iterable[Any]) -> Diversion | None:
        """A publish with the plugin's ``x-delay`` (ms): delayed to the exchange and key it names."""
        delay = delay_of(headers)
        now = self.clock()
        if delay is None or delay <= 0:
            return None
        name, key = exchange_name(exchange), routing_key or ""
        queue_hint = _check_names(name, key, plain_entities(declare))
        # Negative, as the plugin does on delivery: a republish does not delay it twice.
        headers[DELAY_HEADER] = -int(round(delay * 1000))
        return Diversion(name, key, due=now + delay, delay=delay, queue_hint=queue_hint)

    def _native_destination(self, delivery_exchange: str, original_key: str, *, native_key: str) -> tuple[str, str]:
        """Where an undelayed native-ladder publish would have gone: the one ``task_queues`` exchange, else native delivery."""
        exchanges = {q.exchange.name for q in self.app.amqp.queues.values()
                     if q.routing_key == original_key and q.exchange is not None and q.exchange.type != "direct"}
        if len(exchanges) == 1:
            return exchanges.pop(), original_key
        return delivery_exchange, native_key


def _check_names(exchange: str, routing_key: str, declare: Iterable[Any]) -> str | None:
    """Validate every name a delayed publish will use; return the queue that surely receives it.

    That is a queue Celery declares *and* binds so ``exchange``/``routing_key`` reach it, else
    ``None`` (the broker checks routability then).
    """
    check_name("exchange name", exchange)
    check_name("routing key", routing_key)
    receiving = None
    for entity in declare or ():
        name = getattr(entity, "name", None)
        if not isinstance(name, str):
            continue
        if not hasattr(entity, "queue_arguments"):
            check_name("exchange name", name)
            continue
        check_name("queue name", name)
        for binding in (entity, *(getattr(entity, "bindings", None) or ())):  # its own binding, then the others
            bound = getattr(binding, "exchange", None)
            if bound is None:
                continue
            check_name("exchange name", bound.name or "")
            # The default exchange routes by queue name; another, by its type's match of the binding key.
            if receiving is None and (routing_key == name if exchange == "" else (bound.name or "") == exchange and
                                      key_matches(bound.type or "direct", binding.routing_key or "", routing_key)):
                receiving = name
    return receiving


#: The app attribute holding its :class:`AppLadder` (a weak dictionary's value would keep its key alive).
_ATTR = "_delayq_ladder"
_LADDERS_LOCK = threading.Lock()


def ladder_for(app: CeleryApp) -> AppLadder:
    """The app's :class:`AppLadder` (settings, publisher), one per process, without hooking anything (see install)."""
    ladder: AppLadder | None = getattr(app, _ATTR, None)
    if ladder is None:
        with _LADDERS_LOCK:
            ladder = getattr(app, _ATTR, None)
            if ladder is None:
                ladder = AppLadder(app)
                setattr(app, _ATTR, ladder)
    return ladder


def index_of(app: CeleryApp) -> tuple[Connection, IndexLayout]:
    """The connection and the layout the index readers take, for ``app``'s ladder."""
    ladder = ladder_for(app)
    return ladder.connection(), ladder.config.layout


def batch(app: CeleryApp) -> ContextManager[None]:
    """``with batch(app):`` pipelines the publisher confirms of ``app``'s delayed publishes in the block.

    Inside it ``apply_async(countdown=...)`` returns as soon as the message is written; the confirms are
    awaited together when the block ends (the app's :meth:`~celery_delayq.scheduling.Scheduler.batch`), which
    raises :class:`~celery_delayq.errors.PublishError` if any message was refused. Confirms are never
    switched off, only awaited together.
    """
    return ladder_for(app).scheduler.batch()


def ladder_if_any(app: CeleryApp) -> AppLadder | None:
    """The app's :class:`AppLadder` if one was built in this process (builds none)."""
    ladder = getattr(app, _ATTR, None)
    return ladder if isinstance(ladder, AppLadder) else None


def forget_ladder(app: CeleryApp) -> None:
    """Drop the app's :class:`AppLadder`, so the next :func:`ladder_for` reads its settings again."""
    with _LADDERS_LOCK:
        if getattr(app, _ATTR, None) is not None:
            setattr(app, _ATTR, None)


def refresh_ladder(app: CeleryApp) -> None:
    """The app's settings may have changed: let its :class:`AppLadder`, if it has one, read them again."""
    ladder = ladder_if_any(app)
    if ladder is not None:
        ladder.reread()
