"""The worker's half of activation: a delayed task that bypassed the ladder is moved into it (docs/migration.md).

A publisher that never imports celery_delayq sends an ``eta`` message a plain worker would hold in memory.
:class:`TakeoverStep` wraps every task strategy: a future ``eta`` of a task whose delays belong in the ladder is
published into it as received (confirmed), only then acked (a crash between: a duplicate, never a loss). Left to
Celery: ladder deliveries, tasks due within :data:`HOLD_BELOW_S`, revoked, cancelled or expired ones, and what
the ladder refuses now (logged). The worker warns once per publishing host with the line that fixes it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from celery import bootsteps

from ..ladder import headers as H
from .app_ladder import AppLadder
from .extensions import Extension
from ..ladder.delays import parse_eta
from ..errors import InvalidDelay

__all__ = ["TakeoverExtension", "TakeoverStep", "Takeover", "HOLD_BELOW_S", "FIX_LINE"]

log = logging.getLogger(__name__)

#: A task due sooner than this is held by the worker as Celery would (a ladder pass costs tens of ms).
HOLD_BELOW_S = 0.5

#: What the warning tells the operator to add to the publisher's app module.
FIX_LINE = "import celery_delayq  (or celery_delayq.install(app)) in the module that creates the Celery app"

#: Message properties carried into the ladder. ``user_id`` is not: RabbitMQ refuses a
#: publish whose user_id is not the publishing connection's user.
_CARRIED = ("correlation_id", "reply_to", "priority", "delivery_mode", "message_id", "type", "app_id", "timestamp")

Strategy = Callable[..., Any]


class Takeover:
    """Moves one worker's delayed arrivals into its app's ladder (see the module docstring)."""

    def __init__(self, consumer: Any, ladder: AppLadder, *, clock: Callable[[], float] = time.time) -> None:
        self.consumer = consumer
        self.ladder = ladder
        self.clock = clock
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        #: How many tasks this worker moved into the ladder.
        self.moved = 0

    def wrap(self, strategy: Strategy) -> Strategy:
        """Celery's strategy for one task, taking over delayed arrivals first."""
        if getattr(strategy, "delayq_takeover", None) is self:
            return strategy

        def task_message_handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any,
                                 **kwargs: Any) -> Any:
            if self.take(message, ack):
                return None
            return strategy(message, body, ack, reject, callbacks, **kwargs)

        task_message_handler.delayq_takeover = self  # type: ignore[attr-defined]
        return task_message_handler

    def due_of(self, headers: dict[str, Any]) -> float | None:
        """When a message that bypassed the ladder is due, if the ladder should take it; else None."""
        eta = headers.get("eta")
        if not eta or not self.ladder.wants(headers):
            return None  # undelayed, or not a ladder task
        try:
            due = parse_eta(eta)
        except InvalidDelay:
            return None  # Celery's strategy reports an eta it cannot read
        if _left_the_ladder(headers, due):
            return None  # due by construction; only clock skew can make it look early
        if due - self.clock() < HOLD_BELOW_S:
            return None
        task_id = headers.get("id")
        if task_id is not None:  # revoked, or cancelled durably (the cancels extension): Celery's path drops it
            state = getattr(getattr(self.consumer, "controller", None), "state", None)
            if (state is not None and str(task_id) in state.revoked) or \
                    self.ladder.extensions.cancelled(self.ladder, str(task_id)):
                return None
        expires = headers.get("expires")
        if expires:
            try:
                if parse_eta(expires) <= self.clock():
                    return None  # expired: Celery's path discards it
            except InvalidDelay:
                return None
        return due

    def take(self, message: Any, ack: Any) -> bool:
        """Move ``message`` into the ladder and ack it; False leaves it to Celery's strategy."""
        headers = message.headers
        if not isinstance(headers, dict):
            return False  # message protocol 1: its eta is in the body; Celery holds it
        due = self.due_of(headers)
        if due is None:
            return False
        info = message.delivery_info or {}
        properties = message.properties or {}
        props = {k: properties[k] for k in _CARRIED if properties.get(k) is not None}
        try:
            self.ladder.scheduler.schedule(
                message.body, due=due, delay=due - self.clock(), exchange=info.get("exchange") or "",
                routing_key=info.get("routing_key") or "", headers=dict(headers),
                content_type=message.content_type, content_encoding=message.content_encoding,
                queue_hint=self._queue_of(info), **props)
        except Exception as exc:  # noqa: BLE001 - a message we cannot move is held, never lost
            log.error("delayq: could not move task %s[%s] into the ladder (%s); the worker holds it "
                      "until it is due, as Celery does", headers.get("task"), headers.get("id"), exc)
            return False
        ack(log, self.consumer.connection_errors)
        with self._lock:
            self.moved += 1
        self._warn(headers, due)
        return True

    def _queue_of(self, info: dict[str, Any]) -> str | None:
        """The queue the message was consumed from (its consumer tag's), if known."""
        tag = info.get("consumer_tag")
        consumer = getattr(self.consumer, "task_consumer", None)
        tags = getattr(consumer, "_active_tags", None) or {}
        for queue, active in tags.items():
            if active == tag:
                return str(queue)
        return None

    def _warn(self, headers: dict[str, Any], due: float) -> None:
        origin = str(headers.get("origin") or "unknown")
        host = origin.rpartition("@")[2] or origin
        with self._lock:
            first = host not in self._warned
            self._warned.add(host)
        if first:
            log.warning(
                "delayq: task %s[%s] from %s arrived with an eta %.1f s ahead, outside the ladder, although "
                "delayq_enabled is set: moved it into the ladder. The processes on %s that publish it do not "
                "load celery_delayq; to publish into the ladder themselves they need: %s. "
                "(Said once per publishing host.)",
                headers.get("task"), headers.get("id"), origin, due - self.clock(), host, FIX_LINE)
        else:
            log.info("delayq: moved task %s[%s] from %s into the ladder", headers.get("task"),
                     headers.get("id"), origin)


def _left_the_ladder(headers: dict[str, Any], due: float) -> bool:
    """Is this a ladder delivery? Its eta is the due time the ladder stamped on this pass (a retry from a
    process without the package copies the old ``x-delayq-*`` headers with a new eta)."""
    stamped = headers.get(H.DUE)
    if H.ENTRY not in headers or stamped is None:
        return False
    try:
        return abs(float(stamped) - due) < 0.001  # the eta is written from the due time, to the microsecond
    except (TypeError, ValueError):
        return False


class TakeoverStep(bootsteps.StartStopStep):
    """Consumer bootstep: wrap every task strategy with a :class:`Takeover` (after Celery builds them)."""

    requires = ("celery.worker.consumer.tasks:Tasks", "celery_delayq.glue.integration:DelayqWorkerStep")

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.takeover: Takeover | None = None

    def start(self, c: Any) -> None:
        ladder = getattr(c, "delayq_ladder", None)  # handed over by DelayqWorkerStep
        if ladder is None:
            return
        if self.takeover is None:
            self.takeover = Takeover(c, ladder)
        # Celery rebuilds the strategies on every (re)connection (Tasks.start), before this step.
        for name, strategy in list(c.strategies.items()):
            c.strategies[name] = self.takeover.wrap(strategy)


class TakeoverExtension(Extension[AppLadder]):
    """The ``takeover`` extension: the app's workers move delayed tasks that skipped the ladder into it."""

    name = "takeover"
    consumer_steps = (TakeoverStep,)

    def describe(self, ladder: AppLadder) -> str:
        """What it does for the app."""
        return "workers move delayed tasks from publishers without celery_delayq into the ladder"
