"""Turning the ladder on for a Celery app: activation, the producer hook, the worker steps.

How an app's delayed publishes reach the ladder, in one sentence: **the
setting alone turns it on: processes that imported celery_delayq publish
into the ladder themselves; a worker of the app moves any other delayed
task into the ladder on arrival and tells you which publisher to fix.**
:func:`install` does the same explicitly; ``DelayedRetryTask`` tasks install
it for their app when they are bound.

The mechanism, step by step:

* Importing celery_delayq registers :func:`watch_app` as a Celery *fixup*
  (Celery's per-app extension point; its Django support is one) and runs it
  on the apps that already exist. It changes nothing about how the app
  publishes: it watches the app's configuration, however it is given
  (``conf.update``, ``config_from_object``, ``config_source``,
  ``add_defaults`` before or after the load, Celery's ``TestApp`` and pytest
  ``celery_config``; to see a late ``add_defaults`` it wraps that one method
  of the app, because Celery announces nothing else), and :func:`is_installed`
  loads it to answer.
* If ``delayq_enabled`` is set, :func:`install` points the app's two
  producer seams at :class:`~celery_delayq.glue.producer.LadderProducer`: its
  producer pool (``apply_async``, ``send_task``, canvas, retries) and
  ``app.amqp.Producer`` (celery beat); and ``app.amqp.create_task_message``
  at :class:`~celery_delayq.glue.message_check.CheckedTaskMessage`, so a bad
  countdown or eta is an ``InvalidDelay`` before anything is sent. No other
  app, pool or producer in the process is touched, and nothing is patched on
  import.
* The app loads its configuration before its first publish (Celery reads
  ``task_routes`` first), so the first publish already goes through the ladder.
* A process that never imports celery_delayq has no hook (Celery 5.7 builds
  fixups from a fixed list and runs no installed package's code on the
  publishing side without an import). A worker of the app (``celery worker``
  loads the package through its CLI plugin) takes over: its
  :class:`~celery_delayq.glue.takeover.TakeoverStep` moves such a task into the
  ladder before acknowledging it, and warns once per publishing host with the
  line that fixes the publisher.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from typing import Any

from celery import Celery, bootsteps, signals as celery_signals
from celery import _state as celery_state

from ..ladder import headers as H
from .. import signals
from .app_ladder import AppLadder, forget_ladder, ladder_for, refresh_ladder
from ..cancels import CancelStep, hook_revoke, stop_follower, unhook_revoke
from ..config import _lookup, warn_unknown_settings
from .message_check import CheckedTaskMessage
from .producer import LadderProducerPool, producer_factory
from .takeover import TakeoverStep
from ..typing import CeleryApp, WorkerService
from .. import telemetry

__all__ = ["install", "uninstall", "ladder_for", "is_installed", "watch_app",
           "DelayqWorkerStep"]

log = logging.getLogger(__name__)

_INSTALLED: "weakref.WeakKeyDictionary[CeleryApp, AppLadder]" = weakref.WeakKeyDictionary()
_WATCHED: "weakref.WeakSet[CeleryApp]" = weakref.WeakSet()
_LOCK = threading.RLock()
_FIXUP = "celery_delayq.glue.integration:watch_app"


def is_installed(app: CeleryApp) -> bool:
    """Do ``app``'s publishes go through the ladder in this process?

    Right even before anything has read ``app.conf``: the app's configuration
    is loaded to answer, and the ladder installed if ``delayq_enabled`` is set.
    """
    return activate(app)


def install(app: CeleryApp) -> AppLadder:
    """Make ``app``'s delayed publishes wait in the ladder (idempotent); returns its ladder.

    After this, every publish of the app that is delayed (``countdown``, ``eta``,
    ``retry``) goes through the ladder when ``delayq_enabled`` is set, and
    those of :class:`~celery_delayq.DelayedRetryTask` tasks always; a worker of
    the app declares the ladder when it starts. Calling it is optional when
    ``delayq_enabled`` is set (see the module docstring).
    """
    with _LOCK:
        ladder = _INSTALLED.get(app)
        if ladder is not None:
            return ladder
        # Registered first: what follows may load the app's configuration, whose
        # activation callback then finds the app installed and returns.
        ladder = _INSTALLED[app] = ladder_for(app)
        _hook_producers(app, ladder)
        app.on_after_fork.connect(_rehook_after_fork, weak=False)
        if app.Task.Request == "celery.worker.request:Request":
            # App-wide: plain tasks skip the eta timer for due ladder deliveries too.
            app.Task.Request = "celery_delayq.glue.request:LadderRequest"
        if DelayqWorkerStep not in app.steps["consumer"]:
            app.steps["consumer"].add(DelayqWorkerStep)
        # Delayed tasks from publishers that never loaded celery_delayq go into the ladder too.
        app.steps["consumer"].add(TakeoverStep)
        app.steps["consumer"].add(CancelStep)  # durable cancels: load the log, follow it
        hook_revoke(app)  # Celery's revoke is recorded in the cancel log too
        _connect_worker_signals()
        _attach_telemetry(app)
    return ladder


def uninstall(app: CeleryApp) -> None:
    """Undo :func:`install` (tests, mostly): the app's publishes go the plain Celery way again."""
    with _LOCK:
        ladder = _INSTALLED.pop(app, None)
        forget_ladder(app)  # a later install reads the settings again
        if ladder is None:
            return
        amqp = app.amqp
        amqp.__dict__.pop("Producer", None)
        amqp.__dict__.pop("create_task_message", None)
        if isinstance(amqp._producer_pool, LadderProducerPool):
            amqp._producer_pool = None  # the next publish takes kombu's shared pool again
        app.steps["consumer"].discard(DelayqWorkerStep)
        app.steps["consumer"].discard(CancelStep)
        app.steps["consumer"].discard(TakeoverStep)
        unhook_revoke(app)
        stop_follower(app)
        telemetry.detach(app)


def _attach_telemetry(app: CeleryApp) -> None:
    """Record the app's events when ``delayq_telemetry_dir`` is set (a subscriber, removable).

    Only that one setting is read here: install() may run while Celery loads
    the app's configuration, and the rest of the settings are read (and
    checked) when the ladder is first used.
    """
    if _lookup(app.conf, "delayq_telemetry_dir"):
        telemetry.attach(app)


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
    ladder = _INSTALLED.get(sender)
    if ladder is not None:
        _hook_producers(sender, ladder)


# -- activation from the setting ---------------------------------------------------------
def enabled_in(app: CeleryApp) -> bool:
    """Is ``delayq_enabled`` (or Django's ``CELERY_DELAYQ_ENABLED``) set on the app?"""
    return bool(_lookup(app.conf, "delayq_enabled"))


def activate(app: CeleryApp) -> bool:
    """Install the ladder on ``app`` if its configuration says so; is it installed now?

    Reads ``app.conf``, which loads the app's configuration if nothing has yet.
    """
    if app not in _INSTALLED and enabled_in(app):
        install(app)
    return app in _INSTALLED


def watch_app(app: CeleryApp) -> None:
    """Install the ladder on ``app`` whenever its configuration turns ``delayq_enabled`` on.

    Registered as a Celery fixup for every app created after celery_delayq is
    imported, and called on the apps that already existed then. Celery runs
    fixups before it creates the app's signals, and gives no signal for a
    setting added after the configuration is loaded, so the app is watched
    at three points:

    * ``on_after_configure``: sent once every way of configuring the app has
      been applied (``conf.update``, ``config_from_object``, ``config_source``
      and every ``add_defaults`` made before the load, which is how
      ``celery.contrib.testing``'s ``TestApp`` and the pytest plugin's
      ``celery_config`` configure an app), and again when
      ``config_from_object`` replaces a loaded configuration. The receiver is
      connected from a lazy default (``add_defaults(callable)``), the first
      thing Celery evaluates while it loads the configuration;
    * ``conf.update`` after the load: Celery's own observer (``conf.bind_to``);
    * ``add_defaults`` after the load: the one call Celery applies with no
      notice, so the app's ``add_defaults`` is wrapped (on this app only).

    A setting assigned as an attribute after the load (``app.conf.delayq_enabled
    = True``) is seen by :func:`is_installed` and by the app's workers, which
    move every delayed task of the app into the ladder (:mod:`celery_delayq.glue.takeover`).
    """
    if app in _WATCHED:
        return
    _WATCHED.add(app)
    ref = weakref.ref(app)
    _wrap_add_defaults(app, ref)
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


_BOUND_CONF: "weakref.WeakKeyDictionary[CeleryApp, int]" = weakref.WeakKeyDictionary()


def _on_after_configure(sender: Any = None, source: Any = None, **_: Any) -> None:
    """The app's configuration is loaded (or reloaded): warn about typos, activate, watch updates."""
    app = sender
    if app is None:
        return
    warn_unknown_settings(app)  # a typo such as delayq_enable must not pass silently
    if source is not None and _BOUND_CONF.get(app) != id(source) and hasattr(source, "bind_to"):
        _BOUND_CONF[app] = id(source)
        ref = weakref.ref(app)

        def on_update(*args: Any, **kwargs: Any) -> None:
            target = ref()
            keys = [*kwargs, *(k for a in args if isinstance(a, dict) for k in a)]
            if target is not None and any("delayq" in str(k).lower() for k in keys):
                _settings_changed(target)

        source.bind_to(on_update)
    _settings_changed(app)


def _settings_changed(app: CeleryApp) -> None:
    """``delayq_*`` settings may have changed: re-read a ladder that read them, install if enabled."""
    refresh_ladder(app)
    activate(app)


def _wrap_add_defaults(app: CeleryApp, ref: "weakref.ReferenceType[CeleryApp]") -> None:
    original = app.add_defaults

    @functools.wraps(original)
    def add_defaults(fun: Any) -> Any:
        result = original(fun)
        target = ref()
        if target is not None and target.configured:  # applied at once, with no signal
            _settings_changed(target)
        return result

    app.add_defaults = add_defaults  # type: ignore[method-assign]


def _register_fixup() -> None:
    if _FIXUP not in Celery.builtin_fixups:
        Celery.builtin_fixups = frozenset(Celery.builtin_fixups) | {_FIXUP}
    for app in list(getattr(celery_state, "_get_active_apps", lambda: ())()):
        watch_app(app)


# -- worker side -----------------------------------------------------------------------
class DelayqWorkerStep(bootsteps.StartStopStep):
    """Worker bootstep: starts the delay backend's own worker services before consuming, and metrics.

    What a backend needs from each worker is its own
    (:meth:`~celery_delayq.typing.DelayBackend.worker_service`): for the ladder,
    the topology declared, laps relayed and held queues set moving
    (:class:`~celery_delayq.rabbitmq.worker.LadderWorker`).
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.service: WorkerService | None = None
        self.metrics: Any = None  # celery_delayq.metrics.MetricsServer, in the worker's main process only

    def start(self, c: Any) -> None:  # c: Celery's worker Consumer (untyped)
        ladder = _INSTALLED.get(c.app)
        c.delayq_ladder = ladder  # for the steps that require this one (CancelStep): no lookup up a layer
        if ladder is None:
            return
        if self.service is None:
            self.service = ladder.backend.worker_service(ladder.dedicated_connection)
        if self.service is not None:
            log.info("delayq: %s", self.service.start())
        if self.metrics is None and ladder.config.metrics_port is not None:
            from ..metrics import serve

            self.metrics = serve(c.app, int(ladder.config.metrics_port), ladder.config.metrics_address)
            log.info("delayq: metrics on %s port %s", ladder.config.metrics_address, self.metrics.port)

    def stop(self, c: Any) -> None:
        """Celery stops consumer steps on a lost broker connection too: the backend's services
        pause, the metrics exporter keeps its counters (it closes at :meth:`shutdown`)."""
        if self.service is not None:
            self.service.stop()

    def shutdown(self, c: Any) -> None:
        if self.service is not None:
            self.service.shutdown()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None


_WORKER_SIGNALS = [False]


def _connect_worker_signals() -> None:
    if not _WORKER_SIGNALS[0]:
        celery_signals.task_received.connect(_on_task_received, weak=False)
        _WORKER_SIGNALS[0] = True


def _on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Emit :data:`~celery_delayq.signals.message_delivered` for messages that left the ladder."""
    info = getattr(request, "request_dict", None) or {}
    due = info.get(H.DUE)
    if due is None or H.ENTRY not in info:
        return
    now = time.time()
    signals.message_delivered.send(sender=request.task, request=request, due=float(due),
                                   delay=float(info.get(H.DELAY) or 0.0), lateness=now - float(due))


_register_fixup()
