"""The worker side of durable cancels: load the cancel log at start, follow it, drop cancelled tasks.

* :class:`CancelStep` (a consumer bootstep, added by :func:`celery_delayq.install`)
  reads the whole cancel log before the worker consumes its first task, so
  a worker that restarts (even after ``kill -9``) knows every cancel made
  while it was down. It then follows the log in a thread with a connection
  of its own, and reconnects (resuming after the last entry it read) when
  that connection drops.
* :func:`mark_if_cancelled` is called by the worker's request class
  (:class:`~celery_delayq.request.LadderRequest`) whenever Celery asks
  whether a request is revoked. A cancelled id is put in Celery's own
  revoked set, so Celery's revocation path does the rest exactly as for
  ``revoke``: the task does not run, the message is acknowledged, the
  result backend shows ``REVOKED`` and ``task_revoked`` is sent.

A cancel takes effect in a worker once its follower has read it, within
milliseconds while connected; a task due within that time of the cancel,
or while the follower reconnects, may still run.
"""

from __future__ import annotations

import logging
import socket
import threading
import weakref
from typing import Any

from celery import bootsteps

from .. import signals
from ..pending.layout import MARKER, IndexLayout
from ..pending.stream import OFFSET, reader_connection
from .book import CancelBook
from .log import add, load

__all__ = ["CancelFollower", "CancelStep", "mark_if_cancelled", "follower_for", "stop_follower"]

log = logging.getLogger(__name__)

_FOLLOWERS: "weakref.WeakKeyDictionary[Any, CancelFollower]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
#: Seconds between reconnection attempts of the follower (doubling up to the last).
_BACKOFF = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


class CancelFollower:
    """The cancel log of one app's ladder, loaded and followed into a :class:`CancelBook`."""

    def __init__(self, ladder: Any, layout: IndexLayout) -> None:
        self.ladder = ladder
        self.layout = layout
        self.book = CancelBook()
        self._next: int | str = "next"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Load the whole log (blocking), then follow it in a daemon thread."""
        # A worker must not start without its cancels: a slow broker gets about a minute.
        with reader_connection(self.ladder, retries=15) as raw:
            end = load(raw, self.layout, self.book)
        self._next = end + 1 if end is not None else "next"
        log.info("delayq: %d cancelled task id(s) loaded from %s", len(self.book), self.layout.cancel_queue)
        self._thread = threading.Thread(target=self._run, name="delayq-cancels", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop following (the book keeps what it has)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            conn = self.ladder.dedicated_connection("cancel log follower")
            try:
                conn.ensure_connection(max_retries=1)
                ch = conn.connection.channel()
                ch.basic_qos(0, 100, False)
                ch.basic_consume(self.layout.cancel_queue, callback=self._on_message, no_ack=False,
                                 arguments={"x-stream-offset": self._next})
                failures = 0
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=1.0)
                    except socket.timeout:
                        pass
                    conn.heartbeat_check()
            except Exception as exc:  # noqa: BLE001 - keep following whatever happened
                wait = _BACKOFF[min(failures, len(_BACKOFF) - 1)]
                failures += 1
                log.warning("delayq: lost the cancel log %s (%r); reconnecting in %.0f s",
                            self.layout.cancel_queue, exc, wait)
                self._stop.wait(wait)
            finally:
                try:
                    conn.release()
                except Exception:  # noqa: BLE001
                    pass

    def _on_message(self, message: Any) -> None:
        headers = message.headers or {}
        offset = headers.get(OFFSET)
        if MARKER not in headers:
            task_id = add(self.book, headers)
            if task_id:
                log.info("delayq: task %s cancelled", task_id)
        if offset is not None:
            self._next = int(offset) + 1
        message.channel.basic_ack(message.delivery_tag)


def follower_for(app: Any) -> CancelFollower | None:
    """The app's running cancel follower in this process, if any."""
    return _FOLLOWERS.get(app)


def stop_follower(app: Any) -> None:
    """Stop and forget the app's cancel follower (worker shutdown, ``uninstall``)."""
    with _LOCK:
        follower = _FOLLOWERS.pop(app, None)
    if follower is not None:
        follower.stop()


def mark_if_cancelled(request: Any) -> bool:
    """Put a cancelled request's id in Celery's revoked set, so Celery drops it as revoked.

    Called from the worker's request class each time Celery asks whether the
    request is revoked; returns whether it was cancelled.
    """
    if not _FOLLOWERS or getattr(request, "_already_revoked", False):
        return False
    try:
        follower = _FOLLOWERS.get(request.app)
    except TypeError:  # no app to look up
        return False
    if follower is None or not follower.book.cancelled(request.id):
        return False
    from celery.worker.state import revoked

    revoked.add(request.id)
    #: Lets ``task_revoked`` receivers tell a delayq cancel from a plain Celery revoke.
    request.delayq_cancelled = True
    info = getattr(request, "delivery_info", None) or {}
    signals.message_cancelled.send(
        sender=request.app, task_id=request.id, task_name=getattr(request, "name", "") or "",
        queue=info.get("routing_key") or "", attempt=int((request.request_dict or {}).get("retries") or 0),
        reason="cancelled")
    return True


class CancelStep(bootsteps.StartStopStep):
    """Consumer bootstep: load the cancel log before consuming, then follow it."""

    requires = ("celery_delayq.integration:DelayqWorkerStep",)

    def start(self, c: Any) -> None:
        from ..integration import router_for

        ladder = router_for(c.app)
        if ladder is None or c.app in _FOLLOWERS:
            return
        layout = ladder.publisher.declare().index  # (declare() waits for the streams too)
        if layout is None:
            log.warning("delayq: this broker has no streams (RabbitMQ 3.9+): cancels are not durable")
            return
        follower = CancelFollower(ladder, layout)
        follower.start()
        with _LOCK:
            _FOLLOWERS[c.app] = follower

    def shutdown(self, c: Any) -> None:
        stop_follower(c.app)
