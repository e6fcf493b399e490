"""A queue consumed in a daemon thread of a worker, reconnecting after a growing pause until stopped.

The lap relay and the cancel-log follower share this loop; subclasses say what they consume
and what they do with a message.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

import amqp
from kombu import Connection

__all__ = ["QueueFollower", "BACKOFF"]

log = logging.getLogger(__name__)

#: Seconds between reconnection attempts (the last one repeats).
BACKOFF: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


class QueueFollower:
    """Consume :attr:`queue` in a daemon thread until :meth:`stop`; subclasses implement :meth:`on_message`.

    Args:
        connection: A not yet connected kombu connection of its own (one per follower).
        queue: The queue consumed.
        prefetch: Unacked messages the broker may send at once (per consumer).
        thread_name: The thread's name (seen in ``py-spy dump`` and worker logs).
    """

    #: What the warnings call it ("lap relay", "cancel log follower").
    role = "queue follower"

    def __init__(self, connection: Connection, queue: str, *, prefetch: int, thread_name: str) -> None:
        self.connection = connection
        self.queue = queue
        self.prefetch = prefetch
        self.thread_name = thread_name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start consuming in a daemon thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop consuming; unacked messages go back to the queue."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def consume_arguments(self) -> dict[str, Any]:
        """``basic.consume`` arguments of the next (re)connection."""
        return {}

    def on_message(self, channel: amqp.Channel, message: amqp.Message) -> None:
        """Handle one message; ack or reject it on ``channel``."""
        raise NotImplementedError

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            conn = self.connection.clone()
            try:
                conn.ensure_connection(max_retries=1)
                channel = conn.connection.channel()
                channel.basic_qos(0, self.prefetch, False)
                channel.basic_consume(self.queue, no_ack=False, arguments=self.consume_arguments(),
                                      callback=lambda message: self.on_message(channel, message))
                failures = 0
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=1.0)
                    except socket.timeout:
                        pass
                    conn.heartbeat_check()
            except Exception as exc:  # noqa: BLE001 - a broker hiccup: reconnect after a pause, never die
                if self._stop.is_set():
                    return
                wait = BACKOFF[min(failures, len(BACKOFF) - 1)]
                failures += 1
                log.warning("delayq: %s lost %s (%r); reconnecting in %.0f s", self.role, self.queue, exc, wait)
                self._stop.wait(wait)
            finally:
                with contextlib.suppress(Exception):  # closing a dead connection
                    conn.release()
