"""Telemetry as a subscriber: attach it to an app, detach it again.

:func:`attach` connects receivers to Celery's task signals and to :mod:`celery_delayq.signals`;
each records only what concerns *its* app, and never raises into Celery (a failure is logged at
debug). Publisher-side events are recorded once per telemetry directory, however many apps share it.
docs/operations.md ("Telemetry and the analytics report") has which signal records which event.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery import signals as celery_signals

from ..ladder import headers as H
from .. import signals
from ..config import _lookup
from ..glue.app_ladder import AppLadder, ladder_for, ladder_if_any
from ..glue.extensions import Extension
from .events import Cancelled, Delivered, Exhausted, Failed, Parked, Replayed, Retried, Scheduled, Succeeded
from .recorder import TelemetryRecorder, recorder_for
from ..typing import CeleryApp

__all__ = ["Subscription", "TelemetryConfig", "TelemetryExtension", "attach", "detach", "subscription_for"]

log = logging.getLogger(__name__)

#: Parked (task id, attempt) pairs remembered per app, so the task_failure after a parking
#: is not also ``failed``; bounded, as that failure may never come.
_PARKED_MEMORY = 4096
_NOT_PARKED = object()


class TelemetryConfig(Protocol):
    """What :func:`attach` reads of a :class:`~celery_delayq.config.DelayqConfig`."""

    @property
    def telemetry_dir(self) -> str | None: ...

    @property
    def parking_queue_name(self) -> str: ...


def _log_failure(event: str) -> None:  # pragma: no cover - telemetry must never break a task
    log.debug("delayq telemetry: could not record %s", event, exc_info=True)


def _fields(task: Any, request: Any) -> tuple[str, str, str]:
    """``(task_id, task_name, queue)`` of a request (``queue`` = the delivery routing key)."""
    try:
        task_id, name, info = request.id, request.task, request.delivery_info
    except AttributeError:
        task_id = getattr(request, "id", "")
        name = getattr(request, "task", None)
        info = getattr(request, "delivery_info", None)
    if not isinstance(name, str):
        name = getattr(task, "name", "")
    return task_id or "", name or "", (info.get("routing_key") if info else None) or ""


def _retries(request: Any) -> Any:
    return getattr(request, "retries", 0) or 0


def _exc_name(exc: Any) -> str:
    if exc is None:
        return ""
    # Celery wraps exceptions it can't pickle; the wrapper knows the real name.
    return getattr(exc, "exc_cls_name", None) or type(exc).__name__


# -- publisher-side events: one tap per telemetry directory ------------------------------


@dataclass
class _Tap:
    """The publisher-side recording of one telemetry directory, shared by its subscriptions."""

    recorder: TelemetryRecorder
    parking_queues: Counter[str] = field(default_factory=Counter)  # name -> subscriptions that watch it


_TAPS: dict[str, _Tap] = {}
_LOCK = threading.RLock()
_now = time.time


def _on_scheduled(sender: Any = None, plan: Any = None, headers: Any = None, **_: Any) -> None:
    try:
        root = sender.config.telemetry_dir
    except AttributeError:
        return
    tap = _TAPS.get(root) if root else None
    if tap is None:
        return
    try:
        headers = headers or {}
        entry = plan.entry
        tap.recorder.record_event(Scheduled(
            headers.get("id") or entry, headers.get("task") or "", plan.destination.routing_key,
            H.attempt_of(headers), _now(), plan.delay, plan.due, entry, plan.hops))
    except Exception:  # pragma: no cover
        _log_failure("scheduled")


def _on_replayed(sender: Any = None, parked: Any = None, delay: Any = None, **_: Any) -> None:
    try:
        for tap in list(_TAPS.values()):
            if sender in tap.parking_queues:
                tap.recorder.record_event(Replayed(
                    parked.task_id or parked.parked_id, parked.task, parked.routing_key,
                    max(int(parked.attempts or 0) - 1, 0), _now(), float(delay or 0.0)))
    except Exception:  # pragma: no cover
        _log_failure("replayed")


def _tap_acquire(root: str, parking_queue: str) -> _Tap:
    with _LOCK:
        if not _TAPS:
            signals.message_scheduled.connect(_on_scheduled, weak=False, dispatch_uid=_on_scheduled)
            signals.message_replayed.connect(_on_replayed, weak=False, dispatch_uid=_on_replayed)
        tap = _TAPS.get(root)
        if tap is None:
            tap = _TAPS[root] = _Tap(recorder_for(root))
        tap.parking_queues[parking_queue] += 1
        return tap


def _tap_release(root: str, parking_queue: str) -> None:
    with _LOCK:
        tap = _TAPS.get(root)
        if tap is None:
            return
        tap.parking_queues[parking_queue] -= 1
        if tap.parking_queues[parking_queue] <= 0:
            del tap.parking_queues[parking_queue]
        if not tap.parking_queues:
            del _TAPS[root]
        if not _TAPS:
            signals.message_scheduled.disconnect(dispatch_uid=_on_scheduled)
            signals.message_replayed.disconnect(dispatch_uid=_on_replayed)


# -- worker-side events: one subscription per app ---------------------------------------


class Subscription:
    """Telemetry attached to one app (what :func:`attach` returns); :meth:`detach` disconnects its receivers."""

    def __init__(self, app: CeleryApp, root: str, parking_queue: str) -> None:
        self.root = root
        self.parking_queue = parking_queue
        self._app_ref = weakref.ref(app)
        self._tap = _tap_acquire(root, parking_queue)
        self._receivers, self._stop = _worker_receivers(app, self._tap.recorder)
        self._attached = True
        uid = id(self)
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False, dispatch_uid=(uid, signal.name))

    @property
    def app(self) -> Any:
        """The app (None once it is gone)."""
        return self._app_ref()

    @property
    def recorder(self) -> TelemetryRecorder:
        """The recorder the events go to."""
        return self._tap.recorder

    @property
    def attached(self) -> bool:
        """False once :meth:`detach` ran."""
        return self._attached

    def detach(self) -> None:
        """Disconnect every receiver (idempotent); events already buffered are still written."""
        with _LOCK:
            if not self._attached:
                return
            self._attached = False
            self._stop()  # first: an event being dispatched now may still reach a receiver
            uid = id(self)
            for signal, _ in self._receivers:
                signal.disconnect(dispatch_uid=(uid, signal.name))
            _tap_release(self.root, self.parking_queue)
            app = self._app_ref()
            extension = _extension(app) if app is not None else None
            if extension is not None and extension.subscription is self:
                extension.subscription = None

    def __repr__(self) -> str:
        state = "attached" if self._attached else "detached"
        return f"<telemetry Subscription {state} root={self.root!r} app={self.app!r}>"


def _worker_receivers(app: object, recorder: TelemetryRecorder) -> tuple[list[tuple[Any, Callable[..., None]]], Callable[[], None]]:
    """The receivers of one app, and the function that stops them all at once.

    Closures rather than methods: the app check (``sender._app is not app``,
    the first thing every receiver does) and the recording then cost no
    attribute lookups, and ``stop`` rebinds ``app`` so that a detached
    receiver still being dispatched ignores everything.
    """
    record = recorder.record_event
    now = time.time
    parked: OrderedDict[tuple[str, Any], None] = OrderedDict()

    def stop() -> None:
        nonlocal app
        app = _DETACHED

    def on_delivered(sender: Any = None, request: Any = None, due: float = 0.0, delay: float = 0.0,
                     **_: Any) -> None:
        try:
            if sender._app is not app:
                return
            # A worker Request's own retries counter is in the message it carries.
            attempt = (getattr(request, "request_dict", None) or {}).get("retries") or 0
            record(Delivered(*_fields(sender, request), attempt, now(), delay, due))
        except Exception:  # pragma: no cover
            _log_failure("delivered")

    def on_success(sender: Any = None, **_: Any) -> None:
        try:
            if sender._app is not app:
                return
            request = sender.request
            record(Succeeded(*_fields(sender, request), _retries(request), now()))
        except Exception:  # pragma: no cover
            _log_failure("succeeded")

    def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        try:
            if sender._app is not app:
                return
            exc = getattr(reason, "exc", None) or reason
            record(Retried(*_fields(sender, request), _retries(request), now(), _exc_name(exc)))
        except Exception:  # pragma: no cover
            _log_failure("retried")

    def on_exhausted(sender: Any = None, request: Any = None, exc: Any = None, **_: Any) -> None:
        try:
            if sender._app is not app:
                return
            record(Exhausted(*_fields(sender, request), _retries(request), now(), _exc_name(exc)))
        except Exception:  # pragma: no cover
            _log_failure("exhausted")

    def on_parked(sender: Any = None, request: Any = None, exc: Any = None, **_: Any) -> None:
        try:
            if sender._app is not app:
                return
            fields = _fields(sender, request)
            attempt = _retries(request)
            parked[(fields[0], attempt)] = None
            while len(parked) > _PARKED_MEMORY:
                parked.popitem(last=False)
            record(Parked(*fields, attempt, now(), _exc_name(exc)))
        except Exception:  # pragma: no cover
            _log_failure("parked")

    def on_failure(sender: Any = None, task_id: Any = None, exception: Any = None, **_: Any) -> None:
        try:
            if sender._app is not app:
                return
            request = sender.request
            if getattr(request, "id", None) != task_id:  # failed outside the task (worker lost, ...)
                fields: tuple[str, str, str] = (task_id or "", sender.name or "", "")
                attempt = 0
            else:
                fields = _fields(sender, request)
                attempt = _retries(request)
            if parked.pop((fields[0], attempt), _NOT_PARKED) is not _NOT_PARKED:
                return  # it was parked: not a failure that nothing handles
            record(Failed(*fields, attempt, now(), _exc_name(exception)))
        except Exception:  # pragma: no cover
            _log_failure("failed")

    dropped: OrderedDict[str, None] = OrderedDict()

    def on_revoked(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
        try:
            if sender is None or sender._app is not app:
                return
            fields = _fields(sender, request)
            if dropped.pop(fields[0], _NOT_PARKED) is not _NOT_PARKED:
                return  # a delayq cancel, recorded when the worker dropped it
            record(Cancelled(*fields, _retries(request), now(), "expired" if expired else "revoked"))
        except Exception:  # pragma: no cover
            _log_failure("cancelled")

    def on_cancelled(sender: Any = None, task_id: Any = "", task_name: Any = "", queue: Any = "",
                     attempt: Any = 0, reason: Any = "cancelled", **_: Any) -> None:
        try:
            # "requested" is the cancel command; the task is dropped (and
            # recorded, once) when a worker meets it, as Celery's revokes are.
            if sender is not app or reason == "requested":
                return
            dropped[task_id or ""] = None
            while len(dropped) > _PARKED_MEMORY:
                dropped.popitem(last=False)
            record(Cancelled(task_id or "", task_name or "", queue or "", attempt or 0, now(),
                             reason or "cancelled"))
        except Exception:  # pragma: no cover
            _log_failure("cancelled")

    receivers: list[tuple[Any, Callable[..., None]]] = [
        (signals.message_delivered, on_delivered),
        (celery_signals.task_success, on_success),
        (celery_signals.task_retry, on_retry),
        (signals.retry_exhausted, on_exhausted),
        (signals.message_parked, on_parked),
        (celery_signals.task_failure, on_failure),
        (celery_signals.task_revoked, on_revoked),
        (signals.message_cancelled, on_cancelled),
    ]
    return receivers, stop


class _Detached:
    """Stands in for a detached subscription's app: no sender's app is ever this."""


_DETACHED = _Detached()


class TelemetryExtension(Extension[AppLadder]):
    """The ``telemetry`` extension: records the app's events when ``delayq_telemetry_dir`` is set.

    Its :attr:`subscription` is the one :func:`attach` made (which adds the extension if need be).
    """

    name = "telemetry"

    def __init__(self) -> None:
        #: The app's attached subscription, if any.
        self.subscription: Subscription | None = None

    def install(self, ladder: AppLadder) -> None:
        """Attach when ``delayq_telemetry_dir`` is set (only that setting is read: see integration)."""
        if _lookup(ladder.app.conf, "delayq_telemetry_dir"):
            attach(ladder.app)

    def uninstall(self, ladder: AppLadder) -> None:
        """Stop recording."""
        detach(ladder.app)

    def describe(self, ladder: AppLadder) -> str:
        """Where the app's events go (its setting, as every process of the app reads it)."""
        root = ladder.config.telemetry_dir
        if not root:
            return "off (delayq_telemetry_dir is not set)"
        return f"recording events under {root}"


def _extension(app: CeleryApp, *, add: bool = False) -> TelemetryExtension | None:
    """The app's telemetry extension (added to its ladder when ``add``)."""
    ladder = ladder_for(app) if add else ladder_if_any(app)
    if ladder is None:
        return None
    extension = ladder.extensions.get("telemetry")
    if extension is None and add:
        extension = ladder.extensions.add(TelemetryExtension())
    return extension if isinstance(extension, TelemetryExtension) else None


def attach(app: CeleryApp, config: TelemetryConfig | None = None) -> Subscription:
    """Record ``app``'s delayed-task events under ``config.telemetry_dir``; returns the subscription.

    ``config`` defaults to the app's :class:`~celery_delayq.config.DelayqConfig`. Idempotent for
    the same directory; another directory detaches the old one first.

    Raises:
        ValueError: ``config.telemetry_dir`` is not set.
    """
    if config is None:
        from ..config import DelayqConfig

        config = DelayqConfig.from_app(app)
    root = config.telemetry_dir
    if not root:
        raise ValueError("telemetry needs a directory: set delayq_telemetry_dir "
                         "(attach() is only for apps that record telemetry)")
    root = str(root)
    queue = config.parking_queue_name
    extension = _extension(app, add=True)
    assert extension is not None
    with _LOCK:
        current = extension.subscription
        if current is not None:
            if current.attached and current.root == root and current.parking_queue == queue:
                return current
            current.detach()
        subscription = extension.subscription = Subscription(app, root, queue)
        return subscription


def detach(app: CeleryApp) -> None:
    """Stop recording ``app``'s events (no-op when it has no telemetry attached)."""
    extension = _extension(app)
    with _LOCK:
        subscription = extension.subscription if extension is not None else None
    if subscription is not None:
        subscription.detach()


def subscription_for(app: CeleryApp) -> Subscription | None:
    """The telemetry attached to ``app``, if any."""
    extension = _extension(app)
    return extension.subscription if extension is not None else None
