"""The telemetry events: one named tuple per event type.

A tuple per event keeps the worker's hot path cheap (no dict, no validation: the recorder's writer thread formats
it later), and naming the fields makes every producer and every test say what it records. Each type's ``event``
class attribute is the ``event`` field of its JSON line, its fields (:data:`CORE_FIELDS` first) the others, in
this order. The fields are a private named tuple and the public class adds ``event`` (a named tuple's body may
hold nothing but fields; the four failure events share one). Stdlib only.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple, Union

__all__ = ["CORE_FIELDS", "DELAY_EVENTS", "EVENT_CLASSES", "EVENT_TYPES", "FAILURE_EVENTS", "Cancelled", "Delivered",
           "Exhausted", "Failed", "Parked", "Replayed", "Retried", "Scheduled", "Succeeded", "TelemetryEvent"]

#: The fields every event starts with, in this order.
CORE_FIELDS: tuple[str, ...] = ("task_id", "task_name", "queue", "attempt", "ts")


class _ScheduledFields(NamedTuple):
    task_id: str
    task_name: str
    queue: str
    attempt: int
    ts: float
    delay_s: float
    due_at: float
    #: The ladder pass's id (``x-delayq-entry``): unique per pass, even for retries.
    entry: str
    #: Queues the message waits in on its way down.
    hops: int


class Scheduled(_ScheduledFields):
    """The broker confirmed a message into the ladder (written by the publisher)."""

    __slots__ = ()
    event: ClassVar[str] = "scheduled"


class _DeliveredFields(NamedTuple):
    task_id: str
    task_name: str
    queue: str
    attempt: int
    ts: float
    delay_s: float
    due_at: float


class Delivered(_DeliveredFields):
    """A message that waited in the ladder reached a worker."""

    __slots__ = ()
    event: ClassVar[str] = "delivered"


class _SucceededFields(NamedTuple):
    task_id: str
    task_name: str
    queue: str
    attempt: int
    ts: float


class Succeeded(_SucceededFields):
    """The task returned."""

    __slots__ = ()
    event: ClassVar[str] = "succeeded"


class _FailureFields(NamedTuple):
    task_id: str
    task_name: str
    queue: str
    attempt: int
    ts: float
    #: The exception's type name.
    exception: str


class Retried(_FailureFields):
    """The task failed and scheduled a retry."""

    __slots__ = ()
    event: ClassVar[str] = "retried"


class Exhausted(_FailureFields):
    """A retry policy (or ``max_retries``) gave up; ``parked`` or ``failed`` follows."""

    __slots__ = ()
    event: ClassVar[str] = "exhausted"


class Parked(_FailureFields):
    """The message went to a parking queue: retries exhausted, or ``delayq_park_on``."""

    __slots__ = ()
    event: ClassVar[str] = "parked"


class Failed(_FailureFields):
    """The task failed for good: nothing will retry it and it was not parked."""

    __slots__ = ()
    event: ClassVar[str] = "failed"


class _ReplayedFields(NamedTuple):
    task_id: str
    task_name: str
    queue: str
    attempt: int
    ts: float
    #: Seconds the replay waits in the ladder first (0 = at once).
    delay_s: float


class Replayed(_ReplayedFields):
    """A parked message was sent back to its queue (``attempt`` is the parked one's)."""

    __slots__ = ()
    event: ClassVar[str] = "replayed"


class _CancelledFields(NamedTuple):
    task_id: str
    task_name: str
    queue: str
    attempt: int
    ts: float
    #: ``revoked``, ``expired`` or ``cancelled``.
    reason: str


class Cancelled(_CancelledFields):
    """A task was dropped without running: revoked, expired or cancelled."""

    __slots__ = ()
    event: ClassVar[str] = "cancelled"


TelemetryEvent = Union[Scheduled, Delivered, Succeeded, Retried, Exhausted, Parked, Failed, Replayed, Cancelled]

#: Every event type, in lifecycle order.
EVENT_CLASSES: tuple[type[TelemetryEvent], ...] = (
    Scheduled, Delivered, Succeeded, Retried, Exhausted, Parked, Failed, Replayed, Cancelled,
)
#: Every valid value of the ``event`` field, in lifecycle order.
EVENT_TYPES: tuple[str, ...] = tuple(cls.event for cls in EVENT_CLASSES)
#: Events that carry ``delay_s`` and ``due_at`` (the lateness events).
DELAY_EVENTS: frozenset[str] = frozenset({"scheduled", "delivered"})
#: Events that carry ``exception``.
FAILURE_EVENTS: frozenset[str] = frozenset({"retried", "exhausted", "parked", "failed"})
