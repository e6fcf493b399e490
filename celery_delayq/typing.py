"""The typed seams between the layers: what the kombu hook asks, and what schedules a delay.

The producer asks a :class:`DelayRouting` (:meth:`~DelayRouting.divert`, a :class:`Diversion`), then hands the
serialised message to its :class:`Scheduling`, which asks the destination's :class:`DelayBackend` only to place it;
nothing calls back up (docs/how-it-works.md, "The seams between the layers"). :class:`CeleryApp` names the part
of a Celery app the package uses, so that a signature says "a Celery app" rather than ``Any``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from kombu.connection import Connection

__all__ = ["Diversion", "DelayRouting", "DelayBackend", "BackendFactory", "Scheduling", "Receipt", "WorkerService",
           "CeleryApp"]


class CeleryApp(Protocol):
    """What celery_delayq uses of a ``celery.Celery`` app; any Celery app satisfies it.

    Celery ships no type information, so each member is ``Any`` at that edge: the Protocol documents (and lets
    mypy check) which parts of the app this package touches, nothing more.
    """

    #: ``celery.app.utils.Settings``: where the ``delayq_*`` settings are read.
    conf: Any
    #: ``celery.app.amqp.AMQP``: the task queues, and the two producer seams the hook sets.
    amqp: Any
    #: The app's kombu connection pool, which the ladder's producer pool draws from.
    pool: Any
    #: Worker bootsteps per blueprint (``steps["consumer"]``), where the ladder's step goes.
    steps: Any
    #: The app's base task class; its ``Request`` is set app-wide on install.
    Task: Any  # Celery's name
    #: Celery's signal in a forked child (the producer hook is set again there).
    on_after_fork: Any
    #: Has the app loaded its configuration?
    configured: bool
    #: Celery's signal sent once the configuration is loaded (``None`` while the app is built).
    on_after_configure: Any
    #: ``celery.app.control.Control``: revoke, and asking workers (the doctor).
    control: Any

    def connection_for_write(self, url: Any = None, **kwargs: Any) -> "Connection":
        """A new, unconnected kombu connection to the app's (or ``url``'s) broker."""

    def add_defaults(self, fun: Any) -> None:
        """Register a callback run once the app's configuration is loaded."""

    def producer_or_acquire(self, producer: Any = None) -> ContextManager[Any]:
        """``producer``, or one from the app's producer pool (kombu-level publishers)."""

    def send_task(self, name: Any, *args: Any, **kwargs: Any) -> Any:
        """Send a task by name (a rescheduled task's new copy)."""


@dataclass(frozen=True)
class Diversion:
    """What to do with one publish, decided by :meth:`DelayRouting.divert`.

    Attributes:
        exchange: Exchange an undelayed publish goes to (Celery's native
            ladder is unwrapped to the task's real exchange).
        routing_key: Routing key an undelayed publish uses.
        due: Epoch seconds the message is due; ``None`` means "publish it now,
            to ``exchange``/``routing_key``" (a due time already past).
        delay: Seconds from the decision to ``due`` (0 when ``due`` is None).
        queue_hint: Name of the destination queue when the publish names one
            (Celery's ``declare``), so its existence can be checked.
    """

    exchange: str
    routing_key: str
    due: float | None = None
    delay: float = 0.0
    queue_hint: str | None = None


class Receipt(Protocol):
    """What any backend tells about one message it accepted (the RabbitMQ backends' is
    :class:`~celery_delayq.rabbitmq.publisher.LadderReceipt`, which adds its route).

    Backend-neutral, so this module names no backend: the seam's types live below every implementation of it.
    The signals ``before_schedule`` and ``message_scheduled`` carry it as ``plan``.
    """

    @property
    def entry(self) -> str:
        """The message's id in the index of waiting tasks (``pending``, ``cancel``)."""

    @property
    def due(self) -> float:
        """Epoch seconds the message is delivered, never earlier."""

    @property
    def delay(self) -> float:
        """Seconds from the publish to ``due``."""

    @property
    def hops(self) -> int:
        """Queues the message waits in on its way (the ladder: its levels and exit queue; ``fixed``: 1)."""

    @property
    def exchange(self) -> str:
        """The exchange the backend published the message to (the ladder: its entry exchange)."""

    @property
    def routing_key(self) -> str:
        """The routing key it was published with there (the ladder: the key that routes it down the levels)."""


class WorkerService(Protocol):
    """What a backend runs in each worker (the ladder: declare, relay laps, watch held queues)."""

    def start(self) -> str:
        """Start (again, after a lost connection); returns the line the worker logs."""

    def stop(self) -> None:
        """Pause: the worker lost its connection, or is stopping."""

    def shutdown(self) -> None:
        """Stop for good."""


@runtime_checkable
class DelayBackend(Protocol):
    """Something that holds an already serialised message until ``due``, then delivers it.

    The whole contract a backend implements; everything else a delayed publish owes (the delay check, the
    signals, the index entry, the receipts of a ``batch()``) is done once, above every backend, by
    :class:`~celery_delayq.scheduling.Scheduler`. ``delayq_backend`` (per app) and ``delayq_queue_backends``
    (per destination queue) choose one by name (:data:`celery_delayq.config.BACKEND_ALIASES`); its class is a
    :class:`BackendFactory`.
    """

    def place(self, body: bytes | str, *, entry: str, due: float, delay: float, exchange: str, routing_key: str,
              headers: dict[str, Any], content_type: str | None = None, content_encoding: str | None = None,
              queue_hint: str | None = None, **properties: Any) -> tuple[Receipt, dict[str, Any]]:
        """Put ``body`` where it is delivered to ``exchange``/``routing_key`` at ``due``, never earlier.

        Returns the receipt and the headers the message carries. Confirmed before it returns, unless inside
        :meth:`confirming`. Raises :class:`~celery_delayq.errors.PublishError` naming (``entries``) every
        message that may not be scheduled.
        """

    def confirming(self) -> ContextManager[None]:
        """A block whose placements are confirmed together when it ends (nested blocks join)."""

    def worker_service(self, connection_for: Callable[[str], "Connection"],
                       scheduling: "Scheduling") -> WorkerService | None:
        """What each worker of the app runs for this backend (``None``: nothing).

        ``connection_for(role)`` gives a new connection of the backend's own;
        ``scheduling`` is where it puts back what it takes out (the ladder's laps).
        """


#: The settings a backend is built from (``DelayqConfig``; a parameter here, so this module names no layer above it).
ConfigT = TypeVar("ConfigT", contravariant=True)


class BackendFactory(Protocol[ConfigT]):
    """A backend class as ``BACKEND_ALIASES`` names it (``BackendFactory[DelayqConfig]``): it gives the process's instance."""

    def for_connection(self, connection: "Connection", config: ConfigT) -> DelayBackend:
        """The process-wide backend for a broker and settings (built on first use)."""


class Scheduling(Protocol):
    """What the producer hands a delayed message to: the one place above the backends."""

    def batch(self) -> ContextManager[None]:
        """A block whose schedules are confirmed together when it ends (:func:`celery_delayq.batch`)."""

    def schedule(self, body: bytes | str, *, due: float, delay: float, exchange: str, routing_key: str,
                 headers: dict[str, Any], content_type: str | None = None, content_encoding: str | None = None,
                 queue_hint: str | None = None, **properties: Any) -> Receipt:
        """Deliver ``body`` to ``exchange``/``routing_key`` at ``due``; confirmed before it returns."""


@runtime_checkable
class DelayRouting(Protocol):
    """What a :class:`~celery_delayq.glue.producer.LadderProducer` asks about each publish."""

    @property
    def scheduler(self) -> Scheduling:
        """Where delayed messages go (it asks the chosen backend)."""

    def divert(self, headers: dict[str, Any], exchange: Any, routing_key: str | None,
               declare: Iterable[Any]) -> Diversion | None:
        """``None`` to publish unchanged; else where (and when) the message must arrive.

        May normalise ``headers`` in place (it is the message's own header dict). Raises
        :class:`~celery_delayq.errors.DelayqError` subclasses for bad input, before anything is published.
        """
