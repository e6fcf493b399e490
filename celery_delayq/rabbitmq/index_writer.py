"""The index entries the ladder publisher writes: compact, on its own confirm channel, never in the caller's way.

For every message the broker accepts into the ladder, the publisher appends
an entry ``[task_id, task, due, exchange, routing_key, queue, attempt,
entry]`` to the index shard of the task id (a stream, :mod:`.layout`), many
entries per stream message, body JSON:

* a single publish adds its entry, once the broker confirmed the ladder
  message, to the publisher's :class:`IndexBuffer`; the buffer is written
  :data:`LINGER_S` after its first entry (a timer), when it holds
  :data:`CHUNK` entries, before this process reads the index, when the
  publisher closes, and at interpreter exit. A refused message never gets
  an entry. Measured (``index_cost``): one stream message per publish
  cost the confirm-each path 14-21 % of its rate (client and broker CPU,
  not the confirm's wait: not waiting for it gained nothing); buffered,
  7-16 % across three runs on a noisy 2-core host (a flush still sends
  one small message per shard it touches);
* inside ``batch()`` the entries are written when the block ends, for the
  messages the broker confirmed, :data:`CHUNK` per stream message.

Another process sees a task in ``delayq pending`` within :data:`LINGER_S`
plus a round trip of its publish returning; the publishing process sees it
at once (reading flushes its own buffer first).

Writing the index must never fail a publish whose task is scheduled: an
index write that fails is logged. A process that dies between the two
leaves its task out of the index (it still runs, and ``cancel`` works by
id). Measured cost: see the ``index_cost`` benchmark scenario.

Why not a ``BCC`` copy written by the broker (measured on 3.10.8 and
4.3.6): dead-lettering re-routes with the BCC keys too (each hop copied the
message again until every level got a key of its own); a full copy of every
Celery message into a stream costs the broker as much as the ladder publish
itself (raw pipelined publishing at 0.36x on 3.10.8 and 0.54x on 4.3.6);
and a publish routed to the index counts as routed, so the mandatory flag
could no longer report a ladder level that is gone.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import amqp

from ..ladder import headers as H
from .confirms import Tracker

__all__ = ["ENTRIES", "ARGS_MAX", "ARGS_CUT", "CHUNK", "LINGER_S", "IndexBuffer", "flush_buffers", "index_send", "index_settle",
           "index_batch", "batch_entry", "decode_entries"]

log = logging.getLogger(__name__)

#: Header of an index message: how many entries its body holds.
ENTRIES = "x-delayq-index-entries"
#: Entries per index message (about 150 bytes each).
CHUNK = 500
#: Characters of a task's argument text kept in its index entry (longer: cut, marked with :data:`ARGS_CUT`).
ARGS_MAX = 256
#: Marks argument text cut at :data:`ARGS_MAX` (such a task cannot be run now from the index).
ARGS_CUT = " …(cut)"
#: Seconds the entry of a single publish may wait to be written with the next ones.
LINGER_S = 0.25


@dataclass
class Sent:
    """Index messages sent and not yet settled."""

    tracker: Tracker = field(default_factory=Tracker)
    #: Entries they hold (named in the warning when they are lost).
    count: int = 0


def batch_entry(headers: dict[str, Any], task_id: str) -> list[Any]:
    """One entry: ``[task_id, task, due, exchange, routing_key, queue, attempt, entry, args, last_error]``.

    ``args`` is ``[argsrepr, kwargsrepr]`` (Celery's headers), each cut at
    :data:`ARGS_MAX` characters, for search by argument and for run-now; ``last_error``
    is a retry's :data:`~celery_delayq.ladder.headers.LAST_ERROR`. Readers take the first
    eight fields and whatever of the rest is there (entries written before had eight).
    """
    args = None
    if "argsrepr" in headers or "kwargsrepr" in headers:
        args = [_cut(str(headers.get("argsrepr") or "()")), _cut(str(headers.get("kwargsrepr") or "{}"))]
    return [task_id, headers.get("task"), headers.get(H.DUE), headers.get(H.EXCHANGE, ""),
            headers.get(H.ROUTING_KEY, ""), headers.get(H.QUEUE), H.attempt_of(headers),
            headers.get(H.ENTRY), args, headers.get(H.LAST_ERROR)]


def _cut(text: str) -> str:
    return text if len(text) <= ARGS_MAX else text[:ARGS_MAX] + ARGS_CUT


def decode_entries(body: bytes) -> list[list[Any]]:
    """The entries of an index message body."""
    entries: list[list[Any]] = json.loads(body)
    return entries


def _layout(publisher: Any) -> Any:
    topology = publisher.topology
    layout = topology.index if topology is not None else None
    return layout if layout is not None and layout.index else None


def _messages(layout: Any, entries: list[tuple[str, list[Any]]]) -> list[tuple[str, amqp.Message]]:
    shards: dict[int, list[list[Any]]] = collections.defaultdict(list)
    for task_id, entry in entries:
        shards[layout.shard_of(task_id)].append(entry)
    out = []
    for shard, items in sorted(shards.items()):
        for i in range(0, len(items), CHUNK):
            chunk = items[i:i + CHUNK]
            out.append((layout.shard_queue(shard), amqp.Message(
                json.dumps(chunk, separators=(",", ":")).encode(), content_type="application/json",
                delivery_mode=2, application_headers={ENTRIES: len(chunk), H.ENTRY: uuid.uuid4().hex})))
    return out


def index_send(publisher: Any, done: Sequence[tuple[Any, dict[str, Any]]]) -> Sent | None:
    """Send the entries of ``(Scheduled, headers)`` pairs without waiting; None when there is no index.

    Called with the publisher's lock held (its own confirm channel is used).
    """
    layout = _layout(publisher)
    if layout is None or not done:
        return None
    sent = Sent(count=len(done))
    pairs = []
    for sched, headers in done:
        task_id = str(headers.get("id") or sched.entry)
        pairs.append((task_id, batch_entry(headers, task_id)))
    try:
        messages = _messages(layout, pairs)
        publisher.topology.streams_ready(publisher.link.raw)  # created after a new ladder's first message
        publisher._io(sent.tracker, lambda c: [c.publish(m, "", queue, sent.tracker) for queue, m in messages])
    except Exception as exc:  # noqa: BLE001 - the tasks are scheduled; only their listing is missing
        _lost(len(done), exc)
        return None
    return sent


def index_settle(publisher: Any, sent: Sent | None) -> None:
    """Wait for the confirms of ``sent`` (a failure is logged: the tasks are scheduled)."""
    if sent is None:
        return
    try:
        timeout = publisher.config.confirm_timeout
        publisher._io(sent.tracker, lambda c: c.wait(timeout=timeout, tracker=sent.tracker))
        failures = sent.tracker.take_failures()
        if failures:
            raise failures[0]
    except Exception as exc:  # noqa: BLE001 - the tasks are scheduled; only their listing is missing
        _lost(sent.count, exc)


def index_batch(publisher: Any, done: Sequence[tuple[Any, dict[str, Any]]]) -> None:
    """Write and confirm the entries of a ``batch()`` block's confirmed publishes."""
    with publisher._lock:
        index_settle(publisher, index_send(publisher, done))


class IndexBuffer:
    """The entries of one publisher's single publishes, written together (see the module docstring).

    Every method is called with the publisher's lock held, but the timer's
    flush, which takes it.
    """

    def __init__(self, publisher: Any) -> None:
        self._publisher = weakref.ref(publisher)
        self.pairs: list[tuple[Any, dict[str, Any]]] = []
        self._timer: threading.Timer | None = None

    def add(self, sched: Any, headers: dict[str, Any]) -> None:
        """Buffer the entry of a confirmed ladder message; write the buffer when it is full."""
        publisher = self._publisher()
        if publisher is None or _layout(publisher) is None:
            return
        try:  # a new ladder's streams: created now, so a reader never finds them missing
            publisher.topology.streams_ready(publisher.link.raw)
        except Exception as exc:  # noqa: BLE001 - the task is scheduled; only its listing is missing
            _lost(1, exc)
            return
        self.pairs.append((sched, headers))
        _LIVE.add(self)
        if len(self.pairs) >= CHUNK:
            self.flush()
        elif self._timer is None:
            self._timer = threading.Timer(LINGER_S, self._flush_locked)
            self._timer.daemon = True
            self._timer.start()

    def flush(self) -> None:
        """Write and confirm every buffered entry now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pairs, self.pairs = self.pairs, []
        publisher = self._publisher()
        if pairs and publisher is not None:
            index_settle(publisher, index_send(publisher, pairs))

    def forget(self) -> None:
        """In a forked child: the parent writes its own entries."""
        self.pairs = []
        self._timer = None

    def _flush_locked(self) -> None:
        publisher = self._publisher()
        if publisher is None:
            return
        with publisher._lock:
            self._timer = None
            self.flush()


#: Buffers that have held entries in this process (flushed before a read and at exit).
_LIVE: "weakref.WeakSet[IndexBuffer]" = weakref.WeakSet()


def flush_buffers() -> None:
    """Write every buffered index entry of this process (before reading the index, and at exit)."""
    for buffer in list(_LIVE):
        if buffer.pairs:
            buffer._flush_locked()


atexit.register(flush_buffers)


def _lost(n: int, exc: BaseException) -> None:
    log.warning("delayq: %d scheduled task(s) may be missing from the index of waiting tasks "
                "(`delayq pending` may not list them): %s", n, exc)
