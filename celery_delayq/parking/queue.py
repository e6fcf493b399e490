"""``ParkingQueue``: list, inspect, replay and purge the parked messages of one queue."""

from __future__ import annotations

import contextlib
from typing import Callable

import kombu

from ..glue.app_ladder import ladder_for
from ..rabbitmq.client import Connection, raw_connection, throwaway_channel
from ..rabbitmq.probe import queue_depth
from ..rabbitmq.publisher import LadderPublisher
from .errors import ParkedMessageNotFound
from .record import ParkedFilter, ParkedMessage
from .redeclare import redeclare
from .replay import ReplayReport, replay
from .scan import Scan
from ..typing import CeleryApp

__all__ = ["ParkingQueue"]


class ParkingQueue:
    """Operations on one parking queue over a connection of their own.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, connection: kombu.Connection, name: str, *,
                 ladder: Callable[[], LadderPublisher] | LadderPublisher | None = None) -> None:
        self.name = name
        self._kombu = connection.clone()
        self._ladder = ladder

    @classmethod
    def for_app(cls, app: CeleryApp, name: str | None = None) -> "ParkingQueue":
        """The app's parking queue (or ``name``) on the app's ladder broker: the one way the CLI and the
        page open it. Nothing is hooked; only a delayed replay reaches for the app's ladder publisher."""
        ladder = ladder_for(app)
        return cls(ladder.dedicated_connection("parking"), name or ladder.config.parking_queue_name,
                   ladder=lambda: ladder.publisher)

    @property
    def connection(self) -> Connection:
        """The py-amqp connection (connected on first use)."""
        return raw_connection(self._kombu, retries=1)

    def count(self) -> int:
        """Messages in the queue (0 when it does not exist yet)."""
        return queue_depth(self.connection, self.name) or 0

    def list(self, match: ParkedFilter | None = None, limit: int | None = None) -> list[ParkedMessage]:
        """The parked messages that ``match``, oldest first; the queue is left as it was."""
        match = match or ParkedFilter()
        found: list[ParkedMessage] = []
        with Scan(self.connection, self.name) as scan:
            for _message, parked in scan:
                if match(parked):
                    found.append(parked)
                    if limit is not None and len(found) >= limit:
                        break
        return found

    def get(self, parked_id: str) -> ParkedMessage:
        """The parked message whose id starts with ``parked_id``.

        Raises:
            ParkedMessageNotFound: none, or more than one, matches.
        """
        found = self.list(ParkedFilter(ids=(parked_id,)), limit=2)
        if len(found) != 1:
            what = "no parked message" if not found else "more than one parked message"
            raise ParkedMessageNotFound(f"{what} in {self.name!r} has an id starting with {parked_id!r}; "
                                        "run `celery -A APP delayq parking list` to see the ids")
        return found[0]

    def replay(self, match: ParkedFilter | None = None, *, delay: float | None = None,
               limit: int | None = None, reset_attempts: bool = False, batch_size: int = 100,
               progress: Callable[[int, int], None] | None = None) -> ReplayReport:
        """Replay matching messages to their original queue (see :func:`~celery_delayq.parking.replay.replay`)."""
        ladder = self._ladder() if callable(self._ladder) else self._ladder
        return replay(self.connection, self.name, match=match, delay=delay, limit=limit,
                      reset_attempts=reset_attempts, batch_size=batch_size,
                      ladder=ladder if delay else None, progress=progress)

    def purge(self, match: ParkedFilter | None = None, *, batch_size: int = 500,
              progress: Callable[[int, int], None] | None = None) -> int:
        """Delete matching parked messages (all without a filter); returns how many."""
        match = match or ParkedFilter()
        if match.everything:
            if queue_depth(self.connection, self.name) is None:
                return 0
            with throwaway_channel(self.connection) as ch:
                return int(ch.queue_purge(self.name) or 0)
        deleted = pending = seen = 0
        with Scan(self.connection, self.name, transactional=True) as scan:
            for message, parked in scan:
                seen += 1
                if match(parked):
                    scan.ack(message)
                    pending += 1
                if pending >= batch_size:
                    scan.commit()
                    deleted, pending = deleted + pending, 0
                    if progress is not None:
                        progress(seen, scan.total)
            scan.commit()
            deleted += pending
            if progress is not None:
                progress(seen, scan.total)
        return deleted

    def redeclare(self, *, queue_type: str = "quorum", batch_size: int = 500) -> int:
        """Recreate the queue without a delivery limit, keeping every message in order; returns how many.

        The fix for :class:`~celery_delayq.parking.errors.UnsafeToBrowse`: a quorum
        parking queue declared with a delivery limit (RabbitMQ 4.0 to 4.2 give one
        by default) can lose messages when looked at. See :mod:`~celery_delayq.parking.redeclare`.
        """
        return redeclare(self.connection, self.name, queue_type=queue_type, batch_size=batch_size)

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(Exception):
            self._kombu.release()

    def __enter__(self) -> "ParkingQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
