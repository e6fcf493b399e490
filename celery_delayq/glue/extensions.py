"""Features as extensions: named objects with explicit hooks, each keeping its state on the app's ladder.

:func:`~celery_delayq.glue.integration.install` builds the app's :class:`Extensions` from :data:`EXTENSIONS`
(name -> ``"module:Class"``, so the glue imports no feature) less ``delayq_disabled_extensions``; as with
dramatiq's middleware, the glue calls named hooks at fixed points (install/uninstall in every process,
``worker_*`` from the worker's delayq step, ``request_revoked`` per request, ``cancelled`` from the takeover,
``park`` for a giving-up attempt). One instance per app ladder keeps what the feature holds for the app.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Iterator, Mapping, TypeVar

from ..errors import DelayqError

if TYPE_CHECKING:  # the parking hook's argument, handed on untouched
    from ..policies.resolve import RetryOptions

__all__ = ["Extension", "Extensions", "EXTENSIONS", "ExtensionMissing", "enabled_extensions"]

log = logging.getLogger(__name__)

#: The built-in extensions, in install order: name -> ``"module:Class"``. A name in
#: ``delayq_disabled_extensions`` leaves one out (for instance ``["takeover"]``).
EXTENSIONS: dict[str, str] = {
    "takeover": "celery_delayq.glue.takeover:TakeoverExtension",
    "cancels": "celery_delayq.cancels.extension:CancelsExtension",
    "parking": "celery_delayq.parking.extension:ParkingExtension",
    "telemetry": "celery_delayq.telemetry.subscriber:TelemetryExtension",
    "metrics": "celery_delayq.telemetry.metrics:MetricsExtension",
}


class ExtensionMissing(DelayqError):
    """A hook was needed from an extension that is not active on the app (``delayq_disabled_extensions``)."""


#: The ladder type the hooks receive (:class:`~celery_delayq.glue.app_ladder.AppLadder`; a parameter: no import).
L = TypeVar("L")


class Extension(Generic[L]):
    """One feature of the ladder: a name, and hooks the glue calls at fixed points (each a no-op by default)."""

    #: The extension's name: its key in ``ladder.extensions`` and in ``delayq_disabled_extensions``.
    name: ClassVar[str] = ""
    #: Consumer bootsteps (``"module:Class"`` or classes) added to the app's workers by ``install``.
    consumer_steps: ClassVar[tuple[Any, ...]] = ()

    def install(self, ladder: L) -> None:
        """The ladder is being installed on the app in this process."""

    def uninstall(self, ladder: L) -> None:
        """The ladder is being taken off the app: undo :meth:`install`, stop what runs."""

    def worker_start(self, ladder: L, consumer: Any) -> None:
        """A worker of the app (re)starts consuming (``consumer``: Celery's worker Consumer)."""

    def worker_stop(self, ladder: L, consumer: Any) -> None:
        """The worker stops consuming for now (a lost broker connection, or before shutdown)."""

    def worker_shutdown(self, ladder: L, consumer: Any) -> None:
        """The worker shuts down."""

    def request_revoked(self, ladder: L, request: Any) -> bool:
        """Celery asks whether ``request`` is revoked: ``True`` drops it as revoked."""
        return False

    def cancelled(self, ladder: L, task_id: str) -> bool:
        """Was ``task_id`` cancelled (the takeover then leaves it to Celery's revoke path)?"""
        return False

    def park(self, task: Any, request: Any, exc: BaseException, *, reason: str, options: RetryOptions) -> None:
        """Park a ``DelayedRetryTask`` attempt that gives up (the ``parking`` extension's hook)."""
        raise NotImplementedError

    def describe(self, ladder: L) -> str:
        """One line for ``delayq doctor``: what the extension does for this app now."""
        return "on"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _overrides(ext: Extension[Any], hook: str) -> bool:
    return getattr(type(ext), hook) is not getattr(Extension, hook)


class Extensions(Mapping[str, Extension[L]]):
    """The active extensions of one app ladder, by name, in install order (``ladder.extensions``)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Extension[L]] = {}
        self._lock = threading.RLock()
        # The per-request hooks run on every delivery: only the extensions that have them are asked.
        self._revoking: tuple[Extension[L], ...] = ()
        self._cancelling: tuple[Extension[L], ...] = ()

    def __getitem__(self, name: str) -> Extension[L]:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._by_name))

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"<Extensions {list(self._by_name)}>"

    @property
    def names(self) -> list[str]:
        """The active extensions' names, in install order."""
        return list(self._by_name)

    def add(self, extension: Extension[L]) -> Extension[L]:
        """Add ``extension`` unless one of its name is there already; returns the one that is active."""
        with self._lock:
            current = self._by_name.get(extension.name)
            if current is not None:
                return current
            self._by_name[extension.name] = extension
            self._reindex()
            return extension

    def remove(self, name: str) -> Extension[L] | None:
        """Take the extension named ``name`` out (its :meth:`~Extension.uninstall` is the caller's)."""
        with self._lock:
            extension = self._by_name.pop(name, None)
            self._reindex()
            return extension

    def _reindex(self) -> None:
        active = list(self._by_name.values())
        self._revoking = tuple(e for e in active if _overrides(e, "request_revoked"))
        self._cancelling = tuple(e for e in active if _overrides(e, "cancelled"))

    # -- what the glue asks of them ------------------------------------------------------
    def request_revoked(self, ladder: L, request: Any) -> bool:
        """Does an extension drop ``request`` as revoked (see :meth:`Extension.request_revoked`)?"""
        return any(e.request_revoked(ladder, request) for e in self._revoking)

    def cancelled(self, ladder: L, task_id: str) -> bool:
        """Was ``task_id`` cancelled, by any extension's account?"""
        return any(e.cancelled(ladder, task_id) for e in self._cancelling)

    def park(self, task: Any, request: Any, exc: BaseException, *, reason: str, options: RetryOptions) -> None:
        """Park a giving-up attempt through the ``parking`` extension.

        Raises:
            ExtensionMissing: ``parking`` is disabled while the task asks to park (``delayq_park``).
        """
        parking = self._by_name.get("parking")
        if parking is None or not _overrides(parking, "park"):
            raise ExtensionMissing(
                f"cannot park {getattr(request, 'id', '?')}: the parking extension is off "
                "(delayq_disabled_extensions); set delayq_park=False or enable it")
        parking.park(task, request, exc, reason=reason, options=options)

    def each(self, hook: str, ladder: L, *args: Any) -> None:
        """Call one lifecycle hook of every extension, in order (stopping ones in reverse); a failure is logged."""
        reverse = hook in ("uninstall", "worker_stop", "worker_shutdown")
        extensions = list(self._by_name.values())
        for extension in reversed(extensions) if reverse else extensions:
            try:
                getattr(extension, hook)(ladder, *args)
            except Exception:
                if hook in ("install", "worker_start"):
                    raise  # a feature that cannot start must not pass silently
                log.exception("delayq: extension %r failed in %s", extension.name, hook)


def enabled_extensions(disabled: Any) -> dict[str, str]:
    """:data:`EXTENSIONS` without the names ``delayq_disabled_extensions`` lists (a name or a list).

    Raises:
        ValueError: a name that is no extension (a typo must not pass silently).
    """
    names = [disabled] if isinstance(disabled, str) else list(disabled or ())
    unknown = sorted(set(names) - set(EXTENSIONS))
    if unknown:
        raise ValueError(f"delayq_disabled_extensions names no extension: {unknown}; "
                         f"the extensions are {list(EXTENSIONS)}")
    return {name: path for name, path in EXTENSIONS.items() if name not in names}

