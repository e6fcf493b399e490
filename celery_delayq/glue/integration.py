"""Turning the ladder on for a Celery app: activation, the producer hook, the worker steps.

Importing celery_delayq registers :func:`watch_app` as a Celery fixup, which only watches the app's configuration;
once ``delayq_enabled`` is set, :func:`install` hooks the app's producers
(:class:`~celery_delayq.glue.producer.LadderProducer`, :class:`~celery_delayq.glue.message_check.CheckedTaskMessage`)
and builds its extensions, whose worker hooks :class:`DelayqWorkerStep` runs. The activation rule (a worker also
moves delayed tasks from publishers without the package into the ladder): docs/migration.md.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
import weakref
from typing import Any

from celery import Celery, bootsteps, signals as celery_signals
from celery import _state as celery_state

from kombu.utils.imports import symbol_by_name

from ..ladder import headers as H
from .. import signals
from .app_ladder import AppLadder, forget_ladder, ladder_for, ladder_if_any, refresh_ladder
from ..config import setting, warn_unknown_settings
from ..errors import FormatTooNew, SettingsError
from ..ladder.formats import check_format
from .extensions import Extension, enabled_extensions
from .message_check import CheckedTaskMessage
from .producer import LadderProducerPool, producer_factory
from ..typing import CeleryApp, WorkerService

__all__ = ["install", "uninstall", "ladder_for", "is_installed", "watch_app", "DelayqWorkerStep", "SettingsRefusal"]

log = logging.getLogger(__name__)

_WATCHED: "weakref.WeakSet[CeleryApp]" = weakref.WeakSet()
_LOCK = threading.RLock()
_FIXUP = "celery_delayq.glue.integration:watch_app"


def is_installed(app: CeleryApp) -> bool:
    """Do ``app``'s publishes go through the ladder in this process? (Loads the settings; installs if enabled.)"""
    ladder = ladder_if_any(app)
    if (ladder is None or not ladder.installed) and enabled_in(app):
        ladder = install(app)
    return ladder is not None and ladder.installed


def install(app: CeleryApp) -> AppLadder:
    """Make ``app``'s delayed publishes wait in the ladder (idempotent); returns its ladder.

    Delayed publishes (``countdown``, ``eta``, ``retry``) then go through the ladder when
    ``delayq_enabled`` is set, those of :class:`~celery_delayq.DelayedRetryTask` tasks always.
    Optional when ``delayq_enabled`` is set.
    """
    with _LOCK:
        ladder = ladder_for(app)
        if ladder.installed:
            return ladder
        ladder.installed = True  # first: loading the configuration below re-enters activation
        _hook_producers(app, ladder)
        app.on_after_fork.connect(_rehook_after_fork, weak=False)
        if app.Task.Request == "celery.worker.request:Request":
            # App-wide: plain tasks skip the eta timer for due ladder deliveries too.
            app.Task.Request = "celery_delayq.glue.request:LadderRequest"
        if DelayqWorkerStep not in app.steps["consumer"]:
            app.steps["consumer"].add(DelayqWorkerStep)
        celery_signals.task_received.connect(_on_task_received, weak=False)  # Celery skips a receiver it has
        # The app's extensions, less delayq_disabled_extensions (only that setting is read: install() may run
        # while Celery loads the configuration); one added earlier (telemetry.attach) stays.
        for name, path in enabled_extensions(setting(app, "disabled_extensions")).items():
            built: Extension[AppLadder] = symbol_by_name(path)()
            if built.name != name:
                raise ValueError(f"extension {path} is named {built.name!r}, listed as {name!r}")
            extension = ladder.extensions.add(built)
            for step in extension.consumer_steps:
                app.steps["consumer"].add(symbol_by_name(step))
            extension.install(ladder)
    return ladder


def uninstall(app: CeleryApp) -> None:
    """Undo :func:`install` (tests, mostly): the app's publishes go the plain Celery way again."""
    with _LOCK:
        ladder = ladder_if_any(app)
        if ladder is None or not ladder.installed:
            if ladder is not None and ladder.extensions:
                ladder.reread()  # not installed, but telemetry.attach() keeps its subscription on it
            else:
                forget_ladder(app)
            return
        ladder.installed = False
        amqp = app.amqp
        amqp.__dict__.pop("Producer", None)
        amqp.__dict__.pop("create_task_message", None)
        if isinstance(amqp._producer_pool, LadderProducerPool):
            amqp._producer_pool = None  # the next publish takes kombu's shared pool again
        app.steps["consumer"].discard(DelayqWorkerStep)
        ladder.extensions.each("uninstall", ladder)
        for name in reversed(ladder.extensions.names):
            extension = ladder.extensions.remove(name)
            for step in extension.consumer_steps if extension is not None else ():
                app.steps["consumer"].discard(symbol_by_name(step))
        forget_ladder(app)  # a later install reads the settings again


def _hook_producers(app: CeleryApp, ladder: AppLadder) -> None:
    """Point the app's producer pool and ``app.amqp.Producer`` at the ladder's producer, check delays first."""
    amqp = app.amqp
    amqp.Producer = producer_factory(ladder)
    # Celery's own cached attribute (from task_protocols): a bad countdown/eta fails before a message exists.
    amqp.__dict__["create_task_message"] = CheckedTaskMessage(amqp, ladder)
    connections = app.pool
    amqp._producer_pool = LadderProducerPool(connections, limit=connections.limit, routing=ladder)


def _rehook_after_fork(sender: Any = None, **_: Any) -> None:
    # Celery drops the app's producer pool in a forked child; build ours again.
    if (ladder := ladder_if_any(sender)) is not None and ladder.installed:
        _hook_producers(sender, ladder)


# -- activation from the setting ---------------------------------------------------------
def enabled_in(app: CeleryApp) -> bool:
    """Is ``delayq_enabled`` (or Django's ``CELERY_DELAYQ_ENABLED``) set on the app?"""
    return bool(setting(app, "enabled"))


def watch_app(app: CeleryApp) -> None:
    """Install the ladder on ``app`` whenever its configuration turns ``delayq_enabled`` on (a Celery fixup).

    Celery runs fixups before the app's signals exist and announces no late setting, so the app
    is watched at three points: ``on_after_configure`` (connected from a lazy default, the first
    thing Celery evaluates while loading), ``conf.update`` after the load (``conf.bind_to``), and
    ``add_defaults`` after the load (that method is wrapped, on this app only). A setting assigned
    as an attribute later is seen by :func:`is_installed` and by the app's workers.
    """
    if app in _WATCHED:
        return
    _WATCHED.add(app)
    ref = weakref.ref(app)
    add_defaults_of, producer_or_acquire_of = app.add_defaults, app.producer_or_acquire

    @functools.wraps(add_defaults_of)
    def add_defaults(fun: Any) -> Any:
        result = add_defaults_of(fun)
        target = ref()
        if target is not None and target.configured:  # applied at once, with no signal
            _settings_changed(target)
        return result

    @functools.wraps(producer_or_acquire_of)
    def producer_or_acquire(producer: Any = None) -> Any:
        # Load the configuration before the producer pool is built, as Celery 5.6+ does. Before 5.6 Celery loads
        # it *inside* AMQP.producer_pool when a kombu-level publisher's app.producer_or_acquire() reads it first:
        # loading installs the ladder and sets its pool, then Celery assigns its own kombu pool over it, and that
        # first publish would skip the ladder.
        target = ref()
        if producer is None and target is not None and not target.configured:
            target.conf.get("delayq_enabled")  # any read loads it (and installs the ladder if enabled)
        return producer_or_acquire_of(producer)

    app.add_defaults = add_defaults  # type: ignore[method-assign]
    app.producer_or_acquire = producer_or_acquire  # type: ignore[method-assign]
    if getattr(app, "on_after_configure", None) is not None:
        app.on_after_configure.connect(_on_after_configure, sender=app, weak=False)
        if app.configured:
            _on_after_configure(sender=app, source=app.conf)
        return

    def connect_when_loading() -> dict[str, Any]:
        target = ref()
        if target is not None:
            target.on_after_configure.connect(_on_after_configure, sender=target, weak=False)
        return {}  # no defaults: Django's CELERY_DELAYQ_* must keep precedence

    app.add_defaults(connect_when_loading)


#: The configuration objects already observed (``bind_to``) by id, each bound once; weakly held.
_BOUND_SOURCES: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def _on_after_configure(sender: Any = None, source: Any = None, **_: Any) -> None:
    """The app's configuration is loaded (or reloaded): warn about typos, activate, watch updates."""
    app = sender
    if app is None:
        return
    warn_unknown_settings(app)  # a typo such as delayq_enable must not pass silently
    if source is not None and _BOUND_SOURCES.get(id(source)) is not source and hasattr(source, "bind_to"):
        _BOUND_SOURCES[id(source)] = source
        ref = weakref.ref(app)

        def on_update(*args: Any, **kwargs: Any) -> None:
            target = ref()
            keys = [*kwargs, *(k for a in args if isinstance(a, dict) for k in a)]
            if target is not None and any("delayq" in str(k).lower() for k in keys):
                _settings_changed(target)

        source.bind_to(on_update)
    _settings_changed(app)


def _settings_changed(app: CeleryApp) -> None:
    """``delayq_*`` settings may have changed: re-read a ladder that read them, install if enabled.

    An unusable setting is logged in one line and the app's workers refuse to start (:class:`SettingsRefusal`).
    """
    try:
        refresh_ladder(app)
        is_installed(app)  # installs it if enabled
    except SettingsError as exc:
        if "celery_delayq.django.checks" not in sys.modules:  # Django's checks report it (E003), once
            log.error("celery_delayq: %s", exc)
        _SETTINGS_ERRORS[app] = exc
        app.steps["worker"].add(SettingsRefusal)
        return
    if _SETTINGS_ERRORS.pop(app, None) is not None:
        app.steps["worker"].discard(SettingsRefusal)


#: Apps whose ``delayq_*`` settings cannot be used, with the error their workers stop on.
_SETTINGS_ERRORS: "weakref.WeakKeyDictionary[CeleryApp, SettingsError]" = weakref.WeakKeyDictionary()


class SettingsRefusal(bootsteps.Step):
    """Worker step added only while a ``delayq_*`` setting cannot be used: the worker exits 78 (``EX_CONFIG``).

    Started anyway, it would hold every delayed task in memory as an ETA, what ``delayq_enabled`` avoids.
    """

    name = "celery_delayq.settings"

    def __init__(self, w: Any, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        if (found := _SETTINGS_ERRORS.get(w.app)) is not None:
            print(f"celery_delayq: the worker will not start: {found}", file=sys.stderr, flush=True)
            raise SystemExit(78)


#: Ladder header versions newer than this release that deliveries carried, each logged once.
_NEWER_FORMATS: set[str] = set()


def _register_fixup() -> None:
    if _FIXUP not in Celery.builtin_fixups:
        Celery.builtin_fixups = frozenset(Celery.builtin_fixups) | {_FIXUP}
    for app in list(getattr(celery_state, "_get_active_apps", lambda: ())()):
        watch_app(app)


# -- worker side -----------------------------------------------------------------------
class DelayqWorkerStep(bootsteps.StartStopStep):
    """Worker bootstep: starts each delay backend's worker service once before consuming, then the extensions'.

    (:meth:`~celery_delayq.scheduling.Scheduler.worker_services`; for the ladder
    :class:`~celery_delayq.rabbitmq.worker.LadderWorker`.)
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.services: list[WorkerService] | None = None
        self.ladder: AppLadder | None = None

    def start(self, c: Any) -> None:  # c: Celery's worker Consumer (untyped)
        ladder = ladder_if_any(c.app)
        ladder = ladder if ladder is not None and ladder.installed else None
        c.delayq_ladder = ladder  # for the steps that require this one (CancelStep): no lookup up a layer
        if ladder is None:
            return
        self.ladder = ladder
        if self.services is None:
            self.services = ladder.scheduler.worker_services(ladder.dedicated_connection)
        for service in self.services:
            log.info("delayq: %s", service.start())
        ladder.extensions.each("worker_start", ladder, c)

    def stop(self, c: Any) -> None:
        """Also on a lost connection: services pause; extensions keep what outlives it until :meth:`shutdown`."""
        if self.ladder is not None:
            self.ladder.extensions.each("worker_stop", self.ladder, c)
        for service in self.services or ():
            service.stop()

    def shutdown(self, c: Any) -> None:
        for service in self.services or ():
            service.shutdown()
        if self.ladder is not None:
            self.ladder.extensions.each("worker_shutdown", self.ladder, c)


def _on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Emit :data:`~celery_delayq.signals.message_delivered` for messages that left the ladder."""
    info = getattr(request, "request_dict", None) or {}
    if (due := info.get(H.DUE)) is None or H.ENTRY not in info:
        return
    try:
        check_format(info, "ladder")
    except FormatTooNew as exc:  # the task still runs (Celery's format says what); what the headers say may be wrong
        if repr(exc.found) not in _NEWER_FORMATS:
            _NEWER_FORMATS.add(repr(exc.found))
            log.error("delayq: task %s (%s) came out of the ladder with headers this worker cannot read; it runs, "
                      "but its lateness and any reschedule of it are not applied here: %s",
                      getattr(request, "id", "?"), getattr(request, "name", "?"), exc)
    now = time.time()
    signals.message_delivered.send(sender=request.task, request=request, due=float(due),
                                   delay=float(info.get(H.DELAY) or 0.0), lateness=now - float(due))


_register_fixup()
