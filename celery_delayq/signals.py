"""Named hooks, in before/after pairs where it makes sense (dramatiq style).

They are ordinary Celery signals (``celery.utils.dispatch.Signal``), so ``@message_scheduled.connect`` works as
users already know it. Receivers must be quick and must not raise: the telemetry recorder is one of them.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "before_schedule", "message_scheduled", "message_delivered",
    "retry_scheduled", "retry_exhausted", "message_parked", "message_replayed", "message_cancelled",
]

#: A backend placed a message (inside ``batch()`` before its confirm is known, else once confirmed); not sent
#: for a message whose publish failed. Args: ``plan`` (the backend's receipt, e.g.
#: :class:`~celery_delayq.rabbitmq.publisher.LadderReceipt`), ``headers`` (as sent).
before_schedule = Signal(name="delayq.before_schedule", providing_args={"plan", "headers"})

#: After the broker confirmed a message into the ladder.
#: Args: ``plan`` (the backend's receipt, e.g. :class:`~celery_delayq.rabbitmq.publisher.LadderReceipt`), ``headers``.
message_scheduled = Signal(name="delayq.message_scheduled", providing_args={"plan", "headers"})

#: A message that waited in the ladder reached a worker.
#: Args: ``request`` (Celery request), ``due`` (epoch s), ``delay`` (s), ``lateness`` (s).
message_delivered = Signal(name="delayq.message_delivered", providing_args={"request", "due", "delay", "lateness"})

#: A task decided to retry through the ladder.
#: Args: ``request``, ``exc``, ``countdown`` (s), ``attempt``.
retry_scheduled = Signal(name="delayq.retry_scheduled", providing_args={"request", "exc", "countdown", "attempt"})

#: A retry policy gave up. Args: ``request``, ``exc``, ``attempt``.
retry_exhausted = Signal(name="delayq.retry_exhausted", providing_args={"request", "exc", "attempt"})

#: A message was moved to a parking queue. Args: ``request``, ``exc``, ``queue``.
message_parked = Signal(name="delayq.message_parked", providing_args={"request", "exc", "queue"})

#: A parked message was sent back to its queue (the replay is committed).
#: Sender: the parking queue's name. Args: ``parked``
#: (:class:`~celery_delayq.parking.record.ParkedMessage`), ``delay`` (s, ``None`` = at once).
message_replayed = Signal(name="delayq.message_replayed", providing_args={"parked", "delay"})

#: A waiting task was cancelled: it will not run. Sender: the Celery app.
#: Args: ``task_id``, ``task_name``, ``queue`` (``""`` when unknown), ``attempt``,
#: ``reason`` (e.g. ``"cancelled"``). Celery's own ``task_revoked`` covers
#: revoked and expired tasks a worker drops; send this where a task is dropped
#: without a worker (e.g. removed from the ladder).
message_cancelled = Signal(name="delayq.message_cancelled",
                           providing_args={"task_id", "task_name", "queue", "attempt", "reason"})
