"""The typed seams between the layers: what the kombu hook asks, and what schedules a delay.

One delayed publish crosses two seams, each one way:

1. :class:`~celery_delayq.producer.LadderProducer` (kombu layer) asks a
   :class:`DelayRouting` whether a publish is delayed and where it must
   arrive (:meth:`DelayRouting.divert`), and gets a :class:`Diversion` back.
2. It serialises the message itself and hands it to the routing's
   :class:`DelayBackend` (:meth:`DelayBackend.schedule`). The TTL-queue ladder
   (:class:`~celery_delayq.publisher.LadderPublisher`) is the backend today; a
   broker-native delay (RabbitMQ's per-message quorum delays, DESIGN-NOTES §8)
   can be another implementation of the same method, chosen per destination.

Nothing calls back down: the routing never touches the producer, and the
backend never touches either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from .publisher import Scheduled

__all__ = ["Diversion", "DelayRouting", "DelayBackend"]


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


@runtime_checkable
class DelayBackend(Protocol):
    """Something that holds an already serialised message until ``due``, then delivers it."""

    def schedule(self, body: bytes | str, *, due: float, delay: float, exchange: str, routing_key: str,
                 headers: dict[str, Any], content_type: str | None = None,
                 content_encoding: str | None = None, queue_hint: str | None = None,
                 **properties: Any) -> "Scheduled":
        """Deliver ``body`` to ``exchange``/``routing_key`` at ``due``; confirmed before it returns."""
        ...


@runtime_checkable
class DelayRouting(Protocol):
    """What a :class:`~celery_delayq.producer.LadderProducer` asks about each publish."""

    @property
    def backend(self) -> DelayBackend:
        """Where delayed messages go."""
        ...

    def divert(self, headers: dict[str, Any], exchange: Any, routing_key: str | None,
               declare: Iterable[Any]) -> Diversion | None:
        """``None`` to publish unchanged; else where (and when) the message must arrive.

        May normalise ``headers`` in place (it is the message's own header dict).
        Raises :class:`~celery_delayq.errors.DelayqError` subclasses for bad
        input, before anything is published.
        """
        ...
