"""celery_delayq: Celery countdowns, etas and retries that wait in RabbitMQ, not in workers.

Delayed publishes travel through a ladder of TTL queues on RabbitMQ. The
delay is written in base ``radix`` (4 by default): level k has one queue per
non-zero digit d, holding d * radix^k units, so a message waits only in the
levels of its delay's non-zero digits, and the last stage hands it to the
queue it was meant for.

An app whose ``delayq_enabled`` is true switches its own producers to the
ladder when it loads its configuration, in every process that has imported
celery_delayq; :func:`install` does the same explicitly.
"""

from __future__ import annotations

from .config import DelayqConfig
from .errors import (
    BrokerTooOld, BrokerUnavailable, DelayqError, DelayTooLong, InvalidDelay, InvalidName, PublishError,
    PublishNacked, PublishReturned, PublishTimeout, TopologyError, TopologyMismatch,
    TopologyMissing, UnroutableDestination, UnsupportedTransport,
)
from .integration import install, is_installed, ladder_for, router_for, uninstall
from .app_ladder import AppLadder
from .ladder import LadderSpec
from .producer import DelayqProducer, LadderProducer
from .publisher import LadderPublisher, Scheduled, publisher_for
from .task import DelayedRetryTask
from .batching import batch
from .parking import ParkingFailed, ParkingQueue
from .policies import RetryAfter, RetryPolicy
from .queue_delays import DelayedQueue
from .pending import PendingTask, pending
from .cancels import CancelResult, cancel

__all__ = [
    "DelayedRetryTask", "install", "uninstall", "ladder_for", "is_installed", "router_for", "batch",
    "pending", "PendingTask", "cancel", "CancelResult",
    "AppLadder", "LadderProducer",
    "RetryAfter", "RetryPolicy", "ParkingQueue", "ParkingFailed", "DelayedQueue",
    "DelayqConfig", "LadderSpec", "LadderPublisher", "Scheduled", "publisher_for", "DelayqProducer",
    "DelayqError", "InvalidDelay", "DelayTooLong", "InvalidName", "TopologyError", "TopologyMissing",
    "TopologyMismatch", "BrokerTooOld", "BrokerUnavailable", "UnsupportedTransport", "UnroutableDestination",
    "PublishError", "PublishNacked", "PublishReturned", "PublishTimeout",
]

__version__ = "0.1.0"
