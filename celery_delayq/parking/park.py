"""Move a failed message into a parking queue inside the task (so before its ack): confirmed and mandatory,
over one connection per process, or :class:`~celery_delayq.errors.ParkingFailed`."""

from __future__ import annotations

import threading
import time
import traceback as tb
import uuid
import logging
from typing import TYPE_CHECKING, Any

import kombu

from ..ladder import headers as H
from ..ladder.formats import PARKED_FORMAT, VERSIONS
from .. import signals
from ..rabbitmq.client import Message, RecoverableConnectionError, broker_version, declare_queue
from ..rabbitmq.confirms import OwnedConnection
from ..rabbitmq.probe import queue_exists
from ..rabbitmq.registry import ProcessRegistry
from ..errors import BrokerUnavailable, PublishError
from .errors import ParkingFailed
from ..rabbitmq.topology import resolve_queue_type
from . import record as R
from ..glue.raw import RawMessage
from ..rabbitmq.delivery_limit import declare_arguments

if TYPE_CHECKING:  # pragma: no cover
    from ..policies.resolve import RetryOptions

log = logging.getLogger(__name__)

__all__ = ["Parker", "parker_for", "failure_headers", "parking_message", "park_attempt"]

#: Longest traceback kept in a header; AMQP headers share one frame with the properties.
MAX_TRACEBACK = 8000
#: Properties a parked copy keeps. ``expiration`` is dropped: a TTL would silently
#: expire the parked copy (Celery's ``expires`` header still applies at replay).
_KEPT_PROPERTIES = ("content_type", "content_encoding", "priority", "correlation_id",
                    "reply_to", "message_id", "timestamp", "type", "user_id", "app_id")


def failure_headers(*, task: str, task_id: str, attempts: int, first_attempt: float, last_attempt: float,
                    exc: BaseException, reason: str, exchange: str, routing_key: str,
                    now: float | None = None) -> dict[str, Any]:
    """The failure metadata of a parked message (pure)."""
    kind = type(exc)
    trace = "".join(tb.format_exception(kind, exc, exc.__traceback__))
    return {
        R.PARKED_ID: uuid.uuid4().hex, R.PARKED_AT: time.time() if now is None else now,
        R.REASON: reason, R.TASK: task, R.TASK_ID: task_id, R.ATTEMPTS: attempts,
        H.FIRST_ATTEMPT: first_attempt, R.LAST_ATTEMPT: last_attempt,
        R.EXC_TYPE: f"{kind.__module__}.{kind.__qualname__}", R.EXC_MESSAGE: str(exc)[:MAX_TRACEBACK],
        R.TRACEBACK: trace[-MAX_TRACEBACK:],
        R.ORIGIN_EXCHANGE: exchange, R.ORIGIN_ROUTING_KEY: routing_key, PARKED_FORMAT: VERSIONS["parked"],
    }


def parking_message(raw: RawMessage, failure: dict[str, Any]) -> Message:
    """The parked copy of ``raw``: same body, headers and properties, plus ``failure`` (pure)."""
    headers = H.strip_broker_headers(raw.headers)
    headers.update(failure)
    props = {k: raw.properties[k] for k in _KEPT_PROPERTIES if raw.properties.get(k) is not None}
    return Message(raw.body, application_headers=headers, delivery_mode=2, **props)


class Parker:
    """Confirmed, mandatory publishes into parking queues over a connection of its own.

    Thread-safe and fork-safe (a child process reconnects on first use).
    """

    def __init__(self, connection: kombu.Connection, *, queue_type: str = "auto",
                 confirm_timeout: float = 30.0, management_url: str | None = "", spread: bool = False) -> None:
        self.template = connection
        self.queue_type = queue_type
        self.confirm_timeout = confirm_timeout
        #: With ``spread`` and the management API (``management_url``, as ``delayq_management_url``),
        #: a new quorum parking queue leads on the cluster node that leads the fewest queues of the vhost.
        self.management_url = management_url
        self.spread = spread
        self._lock = threading.Lock()
        self._link = OwnedConnection(connection, role="parker")
        self._declared: set[str] = set()

    def after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's connection and lock."""
        self._lock = threading.Lock()
        self._link.after_fork_in_child()

    def park(self, queue: str, message: Message) -> None:
        """Publish ``message`` into ``queue`` and wait for the broker's confirm.

        Raises:
            ParkingFailed: the broker did not take the message; it is NOT parked.
        """
        with self._lock:
            for attempt in range(2):
                try:
                    confirm = self._link.confirm
                    if confirm is None:
                        confirm = self._link.open()
                        self._declared.clear()
                    self._declare(queue)
                    tag = confirm.publish(message, "", queue)
                    confirm.wait(tag, timeout=self.confirm_timeout)
                    if failures := confirm.take_failures():
                        raise ParkingFailed(
                            f"the broker refused the parked copy for {queue!r} ({failures[0]}); "
                            "the message was NOT parked. Check the parking queue (length limits, "
                            "a deleted queue) and the broker's alarms.")
                    return
                except (RecoverableConnectionError, ConnectionError, OSError, BrokerUnavailable) as exc:
                    self._link.drop()
                    if attempt:
                        raise ParkingFailed(f"lost the broker connection while parking into {queue!r} "
                                            f"({exc!r}); the message was NOT parked") from exc
                except PublishError as exc:
                    self._link.drop()
                    raise ParkingFailed(f"no confirm for the parked copy in {queue!r} ({exc}); "
                                        "it may or may not be parked") from exc

    def _declare(self, queue: str) -> None:
        if queue in self._declared:
            return
        raw = self._link.raw
        if not queue_exists(raw, queue):  # an existing queue is used as it is
            version = broker_version(raw)
            qtype = resolve_queue_type(self.queue_type, version)
            args = declare_arguments(qtype, version)
            if self.spread and qtype == "quorum":  # declared through the node leading the fewest (best effort)
                from ..rabbitmq.management import ManagementAPI
                from ..rabbitmq.placement import LeaderPlacement

                api = ManagementAPI.for_broker(self.template, raw, self.management_url)
                if api is not None:
                    LeaderPlacement(api, self.template).place([(queue, args)], balance=True)
            declare_queue(raw, queue, args)
        self._declared.add(queue)

    def close(self) -> None:
        """Close the parking connection (it reopens on the next park)."""
        with self._lock:
            self._link.drop()


_PARKERS: ProcessRegistry[Parker] = ProcessRegistry()


def parker_for(connection: kombu.Connection, *, queue_type: str, confirm_timeout: float,
               management_url: str | None = "", spread: bool = False) -> Parker:
    """The process-wide parker for a broker (created on first use)."""
    key = (connection.as_uri(include_password=True), queue_type, confirm_timeout, management_url, spread)
    return _PARKERS.get(key, lambda: Parker(connection, queue_type=queue_type, confirm_timeout=confirm_timeout,
                                            management_url=management_url, spread=spread))


def park_attempt(task: Any, request: Any, exc: BaseException, *, reason: str, options: "RetryOptions") -> None:
    """Move the attempt's message to ``options.parking_queue``, confirmed, before the task returns.

    Raises:
        ParkingFailed: the message could not be parked (the task then fails with it).
    """
    from ..glue.attempts import current_attempt, first_attempt_time  # the worker side, imported when used
    from ..glue.app_ladder import ladder_for

    attempt = current_attempt(request)
    if attempt.raw is None:
        log.error("delayq: cannot park %s[%s]: the worker did not capture its message; give the task "
                  "delayq_park=True (or keep delayq_park on for the app) and a Request class derived "
                  "from celery_delayq.glue.request.CapturingRequest", task.name, request.id)
        return
    router = ladder_for(task._get_app())
    config = router.config
    failure = failure_headers(
        task=task.name, task_id=request.id, attempts=int(request.retries or 0) + 1,
        first_attempt=first_attempt_time(request), last_attempt=attempt.started, exc=exc, reason=reason,
        exchange=attempt.raw.exchange, routing_key=attempt.raw.routing_key)
    queue_type = config.queue_type if config.parking_queue_type == "auto" else config.parking_queue_type
    parker = parker_for(router.connection(), queue_type=queue_type, confirm_timeout=config.confirm_timeout,
                        management_url=config.management_url, spread=config.leader_placement == "spread")
    try:
        parker.park(options.parking_queue, parking_message(attempt.raw, failure))
    except ParkingFailed as err:
        raise ParkingFailed(f"{task.name}[{request.id}] failed with {exc!r}, and {err}") from exc
    log.warning("delayq: parked %s[%s] in %r (%s: %r)", task.name, request.id, options.parking_queue, reason, exc)
    signals.message_parked.send(sender=task, request=request, exc=exc, queue=options.parking_queue)
