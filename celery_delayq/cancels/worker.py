"""The worker side of durable cancels: load the cancel log at start, follow it, drop cancelled tasks.

:class:`CancelStep` reads the whole log before the first task (so a restarted worker knows every cancel made
while it was down), then follows it, renewing long cancels (:meth:`CancelFollower.renew`);
:func:`mark_if_cancelled` puts a cancelled id in Celery's revoked set, so Celery's own revoke path drops it.
How fast a cancel takes effect, and its limits: docs/cancel.md.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from typing import Any

from celery import bootsteps

from .. import signals
from ..errors import FormatTooNew
from ..rabbitmq.following import QueueFollower
from ..ladder.headers import ENTRY
from ..ladder.index_layout import MARKER, IndexLayout
from ..glue.app_ladder import ladder_if_any
from ..index.cancel_book import CancelBook
from ..index.cancel_log import add, load, record, still_there
from ..index.stream import OFFSET, reader_connection
from ..typing import CeleryApp

__all__ = ["CancelFollower", "CancelStep", "mark_if_cancelled", "drop_if_superseded", "follower_for", "stop_follower"]

log = logging.getLogger(__name__)

#: Seconds between two renewal checks of a running worker (with up to as much again of jitter,
#: so the workers of an app rarely renew the same cancel twice).
RENEW_EVERY_S = 3600.0

_LOCK = threading.Lock()


class CancelFollower(QueueFollower):
    """The cancel log of one app's ladder, loaded and followed into a :class:`CancelBook`."""

    role = "cancel log follower"

    def __init__(self, ladder: Any, layout: IndexLayout) -> None:
        super().__init__(ladder.dedicated_connection("cancel log follower"), layout.cancel_queue,
                         prefetch=100, thread_name="delayq-cancels")
        self.ladder = ladder
        self.layout = layout
        self.book = CancelBook()
        self._next: int | str = "next"
        self._renewer: threading.Thread | None = None
        #: Cancel-log entries of a newer format met so far (each logged as an error).
        self.unreadable = 0

    def start(self) -> None:
        """Load the whole log (blocking), renew what is due, then follow it and renew hourly (daemon threads)."""
        # A worker must not start without its cancels: a slow broker gets about a minute.
        with reader_connection(self.ladder.connection(), retries=15) as raw:
            for old in still_there(raw, self.layout):  # cancels made before the ladder was reshaped still hold
                load(raw, old, self.book, on_unreadable=self._unreadable)
            end = load(raw, self.layout, self.book, on_unreadable=self._unreadable)
        self._next = end + 1 if end is not None else "next"
        log.info("delayq: %d cancelled task id(s) loaded from %s", len(self.book), self.layout.cancel_queue)
        self._renew_quietly()
        super().start()
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(target=self._renew_loop, name="delayq-cancel-renewal", daemon=True)
            self._renewer.start()

    def renew(self, now: float | None = None) -> list[str]:
        """Write again, confirmed, every cancel that would outlive its log entry (see :mod:`celery_delayq.index.cancel_log`).

        Returns the renewed task ids. ``now`` stands for a later time in tests.
        """
        due = self.book.renewals(self.layout.max_age_s, now)
        if not due:
            return []
        with reader_connection(self.ladder.connection()) as raw:
            dues = {task_id: d for task_id, _until in due if (d := self.book.due(task_id)) is not None}
            record(raw, self.layout, [(task_id, until, "renewed") for task_id, until in due],
                   timeout=self.ladder.config.confirm_timeout, dues=dues)
        written = time.time()
        for task_id, until in due:  # the follower reads them too; no second renewal meanwhile
            self.book.add(task_id, until, written)
        log.info("delayq: %d long cancel(s) written again to %s, so they outlive the log's retention",
                 len(due), self.layout.cancel_queue)
        return [task_id for task_id, _until in due]

    def _renew_quietly(self) -> None:
        try:
            self.renew()
        except Exception as exc:  # noqa: BLE001 - retried at the next check, long before any entry goes
            log.warning("delayq: could not renew long cancels in %s (%r); retrying in about an hour",
                        self.layout.cancel_queue, exc)

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S * (1.0 + random.random())):
            self._renew_quietly()

    def _unreadable(self, exc: FormatTooNew) -> None:
        """A cancel written by a newer release: said as an error (this worker cannot honour it), then skipped.

        Skipped rather than stopping the follower: a follower stuck on one entry would miss every later cancel.
        """
        self.unreadable += 1
        log.error("delayq: a cancel in %s cannot be read by this worker, so the task it names may run: %s",
                  self.layout.cancel_queue, exc)

    def consume_arguments(self) -> dict[str, Any]:
        """Resume after the last entry read (the whole log was loaded at start)."""
        return {"x-stream-offset": self._next}

    def on_message(self, channel: Any, message: Any) -> None:
        """Add a cancel to the book and remember where the log was read to."""
        headers = message.headers or {}
        offset = headers.get(OFFSET)
        if MARKER not in headers:
            try:
                task_id = add(self.book, headers)
            except FormatTooNew as exc:
                self._unreadable(exc)
            else:
                if task_id:
                    log.info("delayq: task %s cancelled", task_id)
        if offset is not None:
            self._next = int(offset) + 1
        channel.basic_ack(message.delivery_tag)


def _extension(ladder: Any) -> Any:
    """The ``cancels`` extension of ``ladder`` (``None`` without one), which keeps the running follower."""
    return ladder.extensions.get("cancels") if ladder is not None else None


def follower_for(app: CeleryApp) -> CancelFollower | None:
    """The app's running cancel follower in this process, if any (kept by its ``cancels`` extension)."""
    return getattr(_extension(ladder_if_any(app)), "follower", None)


def stop_follower(app: CeleryApp) -> None:
    """Stop and forget the app's cancel follower (worker shutdown, ``uninstall``)."""
    extension = _extension(ladder_if_any(app))
    with _LOCK:
        follower = getattr(extension, "follower", None)
        if follower is not None:
            setattr(extension, "follower", None)
    if follower is not None:
        follower.stop()


def mark_if_cancelled(request: Any, follower: CancelFollower | None = None) -> bool:
    """Put a cancelled request's id in Celery's revoked set, so Celery drops it as revoked.

    Called from the worker's request class each time Celery asks whether the
    request is revoked; returns whether it was cancelled. ``follower``: the
    app's (looked up when not given).
    """
    if getattr(request, "_already_revoked", False):
        return False
    if follower is None:
        follower = follower_for(request.app)
    if follower is None or not follower.book.cancelled(request.id):
        return False
    from celery.worker.state import revoked

    revoked.add(request.id)
    #: Lets ``task_revoked`` receivers tell a delayq cancel from a plain Celery revoke.
    request.delayq_cancelled = True
    _announce(request, "cancelled")
    return True


def _announce(request: Any, reason: str) -> None:
    """Send :data:`~celery_delayq.signals.message_cancelled` for a dropped delivery."""
    info = getattr(request, "delivery_info", None) or {}
    signals.message_cancelled.send(
        sender=request.app, task_id=request.id, task_name=getattr(request, "name", "") or "",
        queue=info.get("routing_key") or "", attempt=int((request.request_dict or {}).get("retries") or 0),
        reason=reason)


def drop_if_superseded(request: Any, follower: CancelFollower | None = None) -> bool:
    """Drop a delivery whose ladder pass was cancelled (a copy a reschedule or run-now replaced).

    Not a revoke: the task id lives on in its new copy, so it is not put in
    Celery's revoked set and the result backend is not told (the new copy's
    result must not become ``REVOKED``). The message is acknowledged and
    :data:`~celery_delayq.signals.message_cancelled` is sent with reason ``superseded``.
    """
    if getattr(request, "_already_revoked", False):
        return False
    if follower is None:
        follower = follower_for(request.app)
    from celery.worker.state import revoked  # a pass's cancel told by broadcast (.revoke.tell_workers) is there

    entry = (getattr(request, "request_dict", None) or {}).get(ENTRY)
    if not entry or not (entry in revoked or (follower is not None and follower.book.pass_cancelled(entry))):
        return False
    log.info("delayq: dropped %s[%s]: this copy (pass %s) was replaced by a reschedule or run-now",
             getattr(request, "name", ""), request.id, entry)
    request.acknowledge()
    request._already_revoked = True  # Celery asks again before executing: the answer stays "drop"
    _announce(request, "superseded")
    return True


class CancelStep(bootsteps.StartStopStep):
    """Consumer bootstep: load the cancel log before consuming, then follow it (on the ``cancels`` extension)."""

    requires = ("celery_delayq.glue.integration:DelayqWorkerStep",)

    def start(self, c: Any) -> None:
        ladder = getattr(c, "delayq_ladder", None)  # handed over by DelayqWorkerStep, which runs first
        extension = _extension(ladder)
        if ladder is None or extension is None or extension.follower is not None:
            return
        layout = ladder.publisher.declare().index  # (declare() waits for the streams too)
        if layout is None:
            log.warning("delayq: this broker has no streams (RabbitMQ 3.9+): cancels are not durable")
            return
        follower = CancelFollower(ladder, dataclasses.replace(layout, previous=ladder.config.layout.previous))
        follower.start()
        with _LOCK:
            extension.follower = follower

    def shutdown(self, c: Any) -> None:
        stop_follower(c.app)
