"""The index entries of scheduled messages: compact, on a connection of their own, never in the caller's way.

The :class:`~celery_delayq.scheduling.Scheduler` hands each accepted message's entry (:func:`batch_entry`) to the
process's :class:`IndexWriter`, which buffers it (:data:`LINGER_S`, :data:`CHUNK`; inside ``batch()`` until the
block ends) and appends it to the task id's index shard. A failed write is logged, never failing a publish. Why
buffered, and why not a broker-written ``BCC`` copy: docs/how-it-works.md, "The index of waiting tasks".
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import threading
import uuid
from typing import TYPE_CHECKING, Any, Sequence

from kombu.connection import Connection

from ..rabbitmq.client import Message, RecoverableConnectionError, broker_version, throwaway_channel
from ..ladder import headers as H
from ..ladder.formats import FORMAT, VERSIONS
from ..ladder.index_layout import ENTRIES, IndexLayout, index_layout
from ..rabbitmq.confirms import ConfirmChannel, OwnedConnection, Tracker
from ..rabbitmq.registry import ProcessRegistry
from ..typing import Receipt

if TYPE_CHECKING:  # pragma: no cover - only named: the scheduler passes the app's settings
    from ..config import DelayqConfig

__all__ = ["ENTRIES", "ARGS_MAX", "ARGS_CUT", "CHUNK", "LINGER_S", "IndexWriter", "index_writer_for", "flush_buffers",
           "batch_entry", "decode_entries"]

log = logging.getLogger(__name__)

#: Entries per index message (about 150 bytes each).
CHUNK = 500
#: Characters of a task's argument text kept in its index entry (longer: cut, marked with :data:`ARGS_CUT`).
ARGS_MAX = 256
#: Marks argument text cut at :data:`ARGS_MAX` (such a task cannot be run now from the index).
ARGS_CUT = " …(cut)"
#: Seconds the entry of a single publish may wait to be written with the next ones.
LINGER_S = 0.25


def batch_entry(headers: dict[str, Any], task_id: str) -> list[Any]:
    """One entry: ``[task_id, task, due, exchange, routing_key, queue, attempt, entry, args, last_error, last_traceback]``.

    ``args`` is ``[argsrepr, kwargsrepr]`` (Celery's headers), each cut at
    :data:`ARGS_MAX` characters, for search by argument and for run-now; ``last_error``
    is a retry's :data:`~celery_delayq.ladder.headers.LAST_ERROR`, ``last_traceback`` its
    :data:`~celery_delayq.ladder.headers.LAST_TRACEBACK` (``None`` on other passes). Readers take the first
    eight fields and whatever of the rest is there (entries written before had eight).
    """
    args = None
    if "argsrepr" in headers or "kwargsrepr" in headers:
        args = [_cut(str(headers.get("argsrepr") or "()")), _cut(str(headers.get("kwargsrepr") or "{}"))]
    return [task_id, headers.get("task"), headers.get(H.DUE), headers.get(H.EXCHANGE, ""),
            headers.get(H.ROUTING_KEY, ""), headers.get(H.QUEUE), H.attempt_of(headers),
            headers.get(H.ENTRY), args, headers.get(H.LAST_ERROR), headers.get(H.LAST_TRACEBACK)]


def _cut(text: str) -> str:
    return text if len(text) <= ARGS_MAX else text[:ARGS_MAX] + ARGS_CUT


def decode_entries(body: bytes) -> list[list[Any]]:
    """The entries of an index message body."""
    entries: list[list[Any]] = json.loads(body)
    return entries


def _messages(layout: IndexLayout, entries: list[tuple[str, list[Any]]]) -> list[tuple[str, Message]]:
    shards: dict[int, list[list[Any]]] = collections.defaultdict(list)
    for task_id, entry in entries:
        shards[layout.shard_of(task_id)].append(entry)
    out = []
    for shard, items in sorted(shards.items()):
        for i in range(0, len(items), CHUNK):
            chunk = items[i:i + CHUNK]
            out.append((layout.shard_queue(shard), Message(
                json.dumps(chunk, separators=(",", ":")).encode(), content_type="application/json",
                delivery_mode=2, application_headers={ENTRIES: len(chunk), H.ENTRY: uuid.uuid4().hex,
                                                         FORMAT: VERSIONS["index"]})))
    return out


#: Connections opened per write before the entries are given up (logged).
_ATTEMPTS = 2
_RECOVERABLE = (RecoverableConnectionError, ConnectionError, OSError)


class IndexWriter:
    """Writes the index entries of one broker and ladder namespace, on a connection of its own.

    Thread-safe; fork-safe (a child forgets the parent's buffer and connection).
    Nothing it does fails a publish: a write that fails is logged.
    """

    def __init__(self, connection: Connection, config: DelayqConfig) -> None:
        self.config = config
        self._link = OwnedConnection(connection, role="index writer")
        #: Held while writing (the connection, its confirms): a publish's :meth:`add` never waits for it.
        self._io_lock = threading.RLock()
        #: Held only to touch the buffer and its timer. Taken after ``_io_lock``, never before it.
        self._lock = threading.RLock()
        #: The streams' layout once connected (``None`` then: no index on this broker or by the settings).
        self._layout: IndexLayout | None = None
        self._ready = False
        self.pairs: list[tuple[Receipt, dict[str, Any]]] = []
        self._timer: threading.Timer | None = None

    def add(self, receipt: Receipt, headers: dict[str, Any]) -> None:
        """Buffer the entry of a confirmed message; the buffer is written when full or after :data:`LINGER_S`.

        Only the buffer's lock is taken here, so a publish does not wait for a write in flight (the timer's).
        """
        if not self.config.index:
            return
        if not self._ready:  # a new ladder's streams: created now, so a reader never finds them missing
            with self._io_lock:
                if not self._ready:
                    try:
                        self._open()
                    except Exception as exc:  # noqa: BLE001 - the task is scheduled; only its listing is missing
                        _lost(1, exc)
                        return
        with self._lock:
            self.pairs.append((receipt, headers))
            full = len(self.pairs) >= CHUNK
            if not full and self._timer is None:
                self._timer = threading.Timer(LINGER_S, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if full:
            self.flush()

    def write(self, done: Sequence[tuple[Receipt, dict[str, Any]]]) -> None:
        """Write and confirm the entries of confirmed messages now (a ``batch()`` block's)."""
        if self.config.index and done:
            with self._io_lock:
                self._send(done)

    def flush(self) -> None:
        """Write and confirm every buffered entry now."""
        with self._io_lock:
            with self._lock:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                pairs, self.pairs = self.pairs, []
            if pairs:
                self._send(pairs)

    def close(self) -> None:
        """Flush, then close the writer's connection."""
        with self._io_lock:
            self.flush()
            self._link.drop()

    def after_fork_in_child(self) -> None:
        """In a forked child: the parent writes its own entries; reconnect on next use."""
        self._io_lock = threading.RLock()
        self._lock = threading.RLock()
        self.pairs = []
        self._timer = None
        self._link.after_fork_in_child()

    def _send(self, done: Sequence[tuple[Receipt, dict[str, Any]]]) -> None:
        """Publish the entries on the writer's confirm channel and wait for their confirms (``_io_lock`` held)."""
        pairs = []
        for receipt, headers in done:
            task_id = str(headers.get("id") or receipt.entry)
            pairs.append((task_id, batch_entry(headers, task_id)))
        cause: BaseException | None = None
        for _ in range(_ATTEMPTS):
            try:
                confirm = self._link.confirm
                if confirm is None or self._link.idle_too_long():
                    confirm = self._open()
                if self._layout is None:
                    return
                tracker = Tracker()
                for queue, message in _messages(self._layout, pairs):
                    confirm.publish(message, "", queue, tracker)
                confirm.wait(timeout=self.config.confirm_timeout, tracker=tracker)
                if failures := tracker.take_failures():
                    raise failures[0]
                self._link.touch()
                return
            except Exception as exc:  # noqa: BLE001 - the tasks are scheduled; only their listing is missing
                cause = exc
                self._link.drop()
                if not isinstance(exc, _RECOVERABLE):  # a lost connection is opened again, anything else not
                    break
        _lost(len(done), cause)

    def _open(self) -> ConfirmChannel:
        """Connect; on the first connection, learn the layout and make sure its streams exist."""
        confirm = self._link.open()
        if not self._ready:
            raw = self._link.raw
            self._layout = index_layout(self.config.spec, index=self.config.index, version=broker_version(raw))
            if self._layout is not None and self.config.declare:
                with throwaway_channel(raw) as ch:  # one round trip: the streams without waiting, then a barrier
                    for _kind, name, args in self._layout.entities():
                        ch.queue_declare(name, durable=True, auto_delete=False, arguments=args, nowait=True)
                    ch.queue_declare(self._layout.cancel_queue, passive=True)
            self._ready = True
        return confirm


_WRITERS: ProcessRegistry[IndexWriter] = ProcessRegistry()


def index_writer_for(connection: Connection, config: DelayqConfig) -> IndexWriter:
    """The process-wide index writer for a broker and settings (created on first use)."""
    key = (connection.as_uri(include_password=True), config)
    return _WRITERS.get(key, lambda: IndexWriter(connection, config))


def flush_buffers() -> None:
    """Write every buffered index entry of this process (before reading the index, and at exit)."""
    for writer in list(_WRITERS.values()):
        if writer.pairs:
            writer.flush()


atexit.register(flush_buffers)


def _lost(n: int, exc: BaseException | None) -> None:
    log.warning("delayq: %d scheduled task(s) may be missing from the index of waiting tasks "
                "(`delayq pending` may not list them): %s", n, exc)
