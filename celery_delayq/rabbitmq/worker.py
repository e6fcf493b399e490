"""The ladder's worker service (:meth:`~celery_delayq.typing.DelayBackend.worker_service`).

The ladder declared before consuming; laps relayed through the scheduler (:class:`~.laps.LapRelay`);
on RabbitMQ < 4.3, queues a restart left holding set moving (:class:`~.recovery.HeldWatcher`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

import amqp
from kombu.connection import Connection

from ..ladder.humanize import describe_ladder
from .laps import LapRelay
from .management import ManagementAPI
from .recovery import HeldWatcher, Recovery
from .client import broker_version
from ..typing import DelayBackend, Scheduling

if TYPE_CHECKING:  # only the publisher's members, as its Protocol below names them
    from ..config import DelayqConfig
    from ..ladder.spec import LadderSpec
    from .topology import Topology

__all__ = ["LadderWorker"]


class _Ladder(DelayBackend, Protocol):
    """What the worker's services use of :class:`~.publisher.LadderPublisher` (which imports this module)."""

    config: DelayqConfig
    spec: LadderSpec
    template: Connection

    def declare(self, *, explicit: bool = False) -> Topology: ...

    def raw_connection(self) -> amqp.Connection: ...


class LadderWorker:
    """The ladder's services in one worker, one per publisher; started at each consumer start, stopped at each stop."""

    def __init__(self, publisher: _Ladder, connection_for: Callable[[str], Connection],
                 scheduling: Scheduling) -> None:
        self.publisher = publisher
        self.connection_for = connection_for
        self.scheduling = scheduling
        self.relay: LapRelay | None = None
        self.watcher: HeldWatcher | None = None
        self.started_before = False

    def _watch_held_queues(self) -> None:
        raw = self.publisher.raw_connection()
        if broker_version(raw) >= (4, 3):
            return
        config = self.publisher.config
        api = ManagementAPI.for_broker(self.publisher.template, raw, config.management_url)
        if api is not None:
            self.watcher = HeldWatcher(Recovery(api, config.spec.prefix)).start()

    def start(self) -> str:
        """Declare (or verify) the ladder, start relaying laps; returns the line the worker logs."""
        topology = self.publisher.declare()
        ready = f"{describe_ladder(self.publisher.spec, queue_type=topology.queue_type)} ready"
        if not self.started_before:
            self._watch_held_queues()
        elif self.watcher is not None:
            self.watcher.poke()
        self.started_before = True
        if self.relay is None:
            self.relay = LapRelay(self.scheduling, self.connection_for("lap relay"), self.publisher.spec.laps_queue)
        self.relay.start()
        return ready

    def stop(self) -> None:
        """The worker lost its broker connection, or stops: relaying pauses."""
        if self.relay is not None:
            self.relay.stop()

    def shutdown(self) -> None:
        """The worker shuts down: nothing keeps running (a later worker of this process starts afresh)."""
        self.stop()
        self.relay = None
        self.started_before = False
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
