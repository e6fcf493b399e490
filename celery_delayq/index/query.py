"""Reading the index: the delayed tasks and retries waiting in the ladder now.

The index holds one entry per pass through the ladder (:mod:`~celery_delayq.index.writer`); a task is waiting
while the *latest* pass of its id is not due yet, so it is never reported early. What is left out on top of that
(cancelled ids, the passes a reschedule replaced) is judged in :mod:`.lookup`. Reading only looks: the streams
are read from the first entry that can still be waiting (``now - max delay``); a lookup by id reads one shard.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from ..ladder.formats import FORMAT, check_format
from ..ladder.index_layout import IndexLayout
from ..ladder.moments import iso
from ..rabbitmq.client import throwaway_channel
from ..rabbitmq.probe import queue_exists
from .priority import Pause
from .stream import BODY, IndexUnavailable, StreamReader, reader_connection
from .writer import ENTRIES, decode_entries, flush_buffers

if TYPE_CHECKING:  # pragma: no cover
    import kombu

    from ..rabbitmq.client import Connection

__all__ = ["PendingTask", "read_index", "read_passes", "passes_on", "iso"]

#: Connections read in parallel when all shards are read (2 cores here; the broker needs them too).
_PARALLEL = 4
#: Read from this long before ``now - max delay`` (clock skew between hosts).
_SLACK_S = 60.0


@dataclass(frozen=True)
class PendingTask:
    """One task waiting in the ladder.

    Attributes:
        task_id: Celery's task id (else the message id, else the ladder entry id).
        task_name: Celery's task name (``None`` for messages that are not Celery tasks).
        exchange: Exchange it will be delivered to (``""`` = the default exchange).
        routing_key: Routing key it will be delivered with.
        queue: Destination queue, when the publish named one (Celery's ``declare``), else
            the routing key of a publish to the default exchange, else ``None``.
        due: Epoch seconds at which it is due.
        attempt: 0 for the first run, n for the n-th retry.
        entry: Id of this pass through the ladder.
        argsrepr: Celery's ``argsrepr`` header, cut at :data:`~celery_delayq.index.writer.ARGS_MAX`
            characters (``None``: not a Celery task, or listed by an older version).
        kwargsrepr: Celery's ``kwargsrepr`` header, cut the same way.
        last_error: A retry's last exception, ``Type: message`` (short).
        last_traceback: A retry's last traceback (its end, up to 4,000 characters; ``None``
            for other passes and entries written before 1.0).
    """

    task_id: str
    task_name: str | None
    exchange: str
    routing_key: str
    queue: str | None
    due: float
    attempt: int
    entry: str | None = None
    argsrepr: str | None = None
    kwargsrepr: str | None = None
    last_error: str | None = None
    last_traceback: str | None = None

    @property
    def arguments(self) -> str:
        """The arguments in words (``(1, 'a') {'k': 2}``), ``""`` when not known."""
        if self.argsrepr is None and self.kwargsrepr is None:
            return ""
        return f"{self.argsrepr or '()'} {self.kwargsrepr or '{}'}"

    @property
    def due_iso(self) -> str:
        """``due`` as ISO 8601 UTC."""
        return iso(self.due)

    @property
    def destination(self) -> str:
        """Where it goes, in words: ``queue NAME`` or ``EXCHANGE / ROUTING_KEY``."""
        if self.queue:
            return f"queue {self.queue}"
        return f"{self.exchange or '(default)'} / {self.routing_key}"

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``delayq pending --json``."""
        return {"task_id": self.task_id, "task": self.task_name, "exchange": self.exchange,
                "routing_key": self.routing_key, "queue": self.queue, "due": self.due_iso, "attempt": self.attempt,
                "args": self.argsrepr, "kwargs": self.kwargsrepr, "last_error": self.last_error}


def tasks_of(headers: dict[str, Any]) -> list[PendingTask]:
    """The tasks of one index message (:mod:`.writer`); nothing for anything else (a marker).

    Raises:
        FormatTooNew: the message is in a newer index format than this release reads.
    """
    if headers.get(ENTRIES) is None or BODY not in headers:
        return []
    check_format(headers, "index")  # a newer writer's entries are refused, never guessed at
    out = []
    for fields in decode_entries(headers[BODY]):
        task_id, name, due, exchange, routing_key, queue, attempt, entry = fields[:8]
        extra = fields[8:11] + [None] * (11 - len(fields[:11]))  # fields added later: absent in old entries
        if due is not None:
            queue = queue or (routing_key if not exchange else None)
            args = extra[0] if isinstance(extra[0], list) and len(extra[0]) == 2 else [None, None]
            out.append(PendingTask(str(task_id), name, exchange or "", routing_key or "", queue, float(due),
                                   int(attempt or 0), entry, args[0], args[1], extra[1], extra[2]))
    return out


def _layouts(raw: Any, layout: IndexLayout, names: Iterable[str]) -> list[IndexLayout]:
    """``layout`` after the layouts of previous shapes whose index is still on the broker (oldest first), once
    the streams ``names`` of ``layout`` are found on it."""
    with throwaway_channel(raw) as ch:
        for name in names:
            try:
                ch.queue_declare(name, passive=True)
            except Exception as exc:  # amqp.NotFound closes the channel
                if getattr(exc, "code", None) != 404:
                    raise
                raise IndexUnavailable(
                    f"the index of waiting tasks of ladder {layout.spec.namespace!r} is not on the broker "
                    f"(no stream {name!r}). It is declared with the ladder: start a worker, or run "
                    "`celery -A APP delayq topology declare`. Tasks scheduled before it existed are not "
                    "listed.") from None
    return [*(old for old in layout.previous if queue_exists(raw, old.shard_queue(0))), layout]


def read_index(connection: kombu.Connection, layout: IndexLayout, *, task_ids: Iterable[str] = (),
               now: float | None = None) -> dict[str, PendingTask]:
    """The latest pass of every task id in the index of ``layout`` on ``connection``'s broker
    (due or not, cancelled or not).

    With ``task_ids``, only their shards are read and only their entries parsed. Without, the whole
    index is read, and its shard readers pause while a lookup of this process runs
    (:mod:`.priority`: a person waits for that one).

    Raises:
        IndexUnavailable: the index is off, the broker has no streams, or the index is not declared.
    """
    now = time.time() if now is None else now
    flush_buffers()  # this process's own publishes are listed at once
    ids = sorted(set(task_ids))
    _require_index(layout)
    shards = sorted({layout.shard_of(i) for i in ids}) if ids else list(range(layout.shards))
    with reader_connection(connection) as raw:
        layouts = _layouts(raw, layout, [layout.shard_queue(h) for h in shards])
    prefilter = re.compile(b"|".join(re.escape(i.encode()) for i in ids)) if ids else None
    wanted = set(ids)
    pause = None if ids else Pause()  # made here: a read begun in an urgent block never pauses

    def one(job: tuple[IndexLayout, int]) -> dict[str, PendingTask]:
        where, shard = job
        with reader_connection(connection) as raw:  # each shard on a connection of its own
            # offsets increase: a later pass replaces an earlier one
            return {task.task_id: task for task in _passes_on(raw, where, shard, _start(where, now), prefilter, pause)
                    if not wanted or task.task_id in wanted}

    jobs = [(where, shard) for where in layouts for shard in shards]
    if len(jobs) == 1:
        return one(jobs[0])
    latest: dict[str, PendingTask] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(_PARALLEL, len(jobs))) as pool:
        for found in pool.map(one, jobs):  # in order: a previous shape's passes, then the current one's
            latest.update(found)  # a task id lives in one shard only
    return latest


def _require_index(layout: IndexLayout) -> None:
    if not layout.index:
        raise IndexUnavailable("the index of waiting tasks is off (delayq_index = False); turn it on to "
                               "list waiting tasks (tasks scheduled while it was off are not listed)")


def _start(layout: IndexLayout, now: float) -> datetime:
    # Read from the first entry that can still be waiting at ``now``, and never from the
    # future: a start after the stream's end would never reach the reader's end marker.
    since = min(now, time.time()) - layout.spec.max_delay_s - _SLACK_S
    return datetime.fromtimestamp(max(0.0, since), tz=timezone.utc)


def _passes_on(raw: Connection, layout: IndexLayout, shard: int, start: datetime,
               prefilter: re.Pattern[bytes] | None, pause: Callable[[], None] | None = None) -> Iterator[PendingTask]:
    """Every pass in one shard of the index from ``start``, oldest first, on an open reader connection."""
    reader = StreamReader(raw, layout.shard_queue(shard))
    for _offset, headers, _message_id in reader.read(start, (ENTRIES, FORMAT), prefilter=prefilter, pause=pause):
        yield from tasks_of(headers)


def read_passes(connection: kombu.Connection, layout: IndexLayout, task_id: str,
                now: float | None = None) -> list[PendingTask]:
    """Every pass of ``task_id`` through the ladder the index still holds (from ``now - max delay``), oldest
    first: its first delay, each retry, each move. One shard is read.

    Raises:
        IndexUnavailable: as :func:`read_index`.
    """
    _require_index(layout)
    with reader_connection(connection) as raw:
        return passes_on(raw, layout, task_id, now)


def passes_on(raw: Connection, layout: IndexLayout, task_id: str, now: float | None = None) -> list[PendingTask]:
    """:func:`read_passes` on an open reader connection (:func:`~.stream.reader_connection`'s): a lookup
    reads the shard and the cancel log on one connection. The last pass is the latest, as
    :func:`read_index` with this id finds it."""
    _require_index(layout)
    flush_buffers()  # this process's own publishes are listed at once
    shard = layout.shard_of(task_id)
    prefilter = re.compile(re.escape(task_id.encode()))
    now = time.time() if now is None else now
    return [t for where in _layouts(raw, layout, [layout.shard_queue(shard)])
            for t in _passes_on(raw, where, shard, _start(where, now), prefilter) if t.task_id == task_id]
