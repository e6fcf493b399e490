"""celery_delayq: Celery countdowns, etas and retries that wait in RabbitMQ, not in workers.

Delayed publishes travel through a ladder of TTL queues on RabbitMQ. The delay is written in base ``radix`` (4
by default): level k has one queue per non-zero digit d, holding d * radix^k units, so a message waits only in
the levels of its delay's non-zero digits, and the last stage hands it to the queue it was meant for.

``delayq_enabled = True`` alone turns it on: processes that imported celery_delayq publish into the ladder
themselves; a worker of the app moves any other delayed task into the ladder on arrival and tells you which
publisher to fix. :func:`install` does the same explicitly.
"""

from __future__ import annotations

from . import signals
from .config import DelayqConfig
from .errors import (
    BrokerTooOld, BrokerUnavailable, DelayqError, FormatTooNew, DelayTooLong, InvalidDelay, InvalidName, PublishError,
    PublishNacked, PublishReturned, PublishTimeout, TopologyError, TopologyMismatch,
    TopologyMissing, SettingsError, UnroutableDestination, UnsupportedTransport,
)
from .inputs import BadInput
from .glue.integration import install, is_installed, ladder_for, uninstall
from .glue.app_ladder import AppLadder, batch
from .ladder.spec import LadderSpec
from .glue.producer import LadderProducer
from .rabbitmq.publisher import LadderPublisher, LadderReceipt, publisher_for
from .scheduling import Scheduler
from .glue.task import DelayedRetryTask
from .parking import ParkedMessage, ParkedMessageNotFound, ParkingError, ParkingFailed, ParkingQueue, UnsafeToBrowse
from .policies import RetryAfter, RetryPolicy
from .glue.queue_delays import DelayedQueue
from .index import AmbiguousTaskId, IndexUnavailable, PendingTask, TaskIdError, TaskIdNotFound
from .pending import pending
from .cancels.requests import CancelResult, cancel

#: Deprecated alias of :class:`LadderReceipt` (``Scheduled`` now names only the telemetry event).
Scheduled = LadderReceipt

# Grouped as docs/api.md is; tests/test_api.py checks that every name is documented there.
__all__ = [
    # tasks and settings
    "DelayedRetryTask", "DelayqConfig", "DelayedQueue", "batch",
    # activation
    "install", "uninstall", "ladder_for", "is_installed", "AppLadder",
    # kombu-level publishing
    "LadderProducer", "LadderPublisher", "Scheduler", "LadderReceipt", "Scheduled", "publisher_for", "LadderSpec",
    # policies
    "RetryPolicy", "RetryAfter",
    # parking
    "ParkingQueue", "ParkedMessage",
    # pending and cancel
    "pending", "PendingTask", "cancel", "CancelResult",
    # signals
    "signals",
    # errors
    "DelayqError", "SettingsError", "BadInput", "InvalidDelay", "DelayTooLong", "InvalidName", "TopologyError", "TopologyMissing",
    "TopologyMismatch", "BrokerTooOld", "BrokerUnavailable", "UnsupportedTransport", "UnroutableDestination",
    "PublishError", "PublishNacked", "PublishReturned", "PublishTimeout",
    "ParkingError", "ParkingFailed", "ParkedMessageNotFound", "UnsafeToBrowse", "IndexUnavailable",
    "TaskIdError", "TaskIdNotFound", "AmbiguousTaskId", "FormatTooNew",
]

__version__ = "1.0.0rc1"
