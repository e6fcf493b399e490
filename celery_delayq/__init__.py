"""celery_delayq: Celery countdowns, etas and retries that wait in RabbitMQ, not in workers.

Delayed publishes travel through a ladder of TTL queues on RabbitMQ, whose
levels hold 2^k units each; a message waits only in the levels of its
delay's set bits, and the last stage hands it to the queue it was meant for.
"""

from __future__ import annotations

from .config import DelayqConfig
from .errors import (
    BrokerTooOld, DelayqError, DelayTooLong, InvalidDelay, InvalidName, PublishError,
    PublishNacked, PublishReturned, PublishTimeout, TopologyError, TopologyMismatch,
    TopologyMissing, UnroutableDestination, UnsupportedTransport,
)
from .integration import install, router_for, uninstall
from .ladder import LadderSpec
from .producer import DelayqProducer
from .publisher import LadderPublisher, Scheduled, publisher_for
from .task import DelayedRetryTask
from .batching import batch
from .parking import ParkingFailed, ParkingQueue
from .policies import RetryAfter, RetryPolicy
from .queue_delays import DelayedQueue

__all__ = [
    "DelayedRetryTask", "install", "uninstall", "router_for", "batch",
    "RetryAfter", "RetryPolicy", "ParkingQueue", "ParkingFailed", "DelayedQueue",
    "DelayqConfig", "LadderSpec", "LadderPublisher", "Scheduled", "publisher_for", "DelayqProducer",
    "DelayqError", "InvalidDelay", "DelayTooLong", "InvalidName", "TopologyError", "TopologyMissing",
    "TopologyMismatch", "BrokerTooOld", "UnsupportedTransport", "UnroutableDestination",
    "PublishError", "PublishNacked", "PublishReturned", "PublishTimeout",
]

__version__ = "0.1.0"
