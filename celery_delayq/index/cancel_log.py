"""The cancel log: a RabbitMQ stream of cancelled task ids, written by ``cancel`` and read by workers.

One message per cancelled id; its headers say which id, until when the cancel holds and when it was written
(:data:`AT`), so workers ignore expired entries and write again a cancel that outlives the stream's retention
(docs/how-it-works.md, "The index of waiting tasks").
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..errors import FormatTooNew
from ..ladder.formats import FORMAT, VERSIONS, check_format
from ..ladder.headers import ENTRY
from ..ladder.index_layout import IndexLayout
from ..rabbitmq.confirms import combine
from .cancel_book import CancelBook
from ..rabbitmq.probe import queue_exists
from .stream import StreamReader, append, reader_connection

if TYPE_CHECKING:  # pragma: no cover
    import kombu

    from ..rabbitmq.client import Connection

__all__ = ["CANCEL", "CANCEL_PASS", "UNTIL", "REASON", "AT", "DUE", "FIELDS", "record", "record_passes", "load", "add",
           "read_cancel_book", "cancel_book_on", "still_there"]

#: Header: the cancelled task id.
CANCEL = "x-delayq-cancel"
#: Header: epoch seconds until which the cancel holds.
UNTIL = "x-delayq-cancel-until"
#: Header: a cancelled ladder pass (its ``x-delayq-entry``), instead of a whole task id
#: (:mod:`celery_delayq.cancels.reschedule`).
CANCEL_PASS = "x-delayq-cancel-pass"
#: Header: why (``cancelled`` by ``delayq cancel``, ``revoked`` through Celery's revoke).
REASON = "x-delayq-cancel-reason"
#: Header: epoch seconds at which the entry was written (its retention counts from then).
AT = "x-delayq-cancel-at"
#: Header: the task's due time, when the cancel found it waiting (it stays in the ladder's queues till then).
DUE = "x-delayq-cancel-due"
#: The headers a reader of the log decodes.
FIELDS = (CANCEL, CANCEL_PASS, UNTIL, AT, DUE, FORMAT)


def record(raw: Connection, layout: IndexLayout, items: Sequence[tuple[str, float, str]], *,
           timeout: float = 30.0, at: float | None = None, dues: Mapping[str, float] | None = None) -> None:
    """Append ``(task_id, until, reason)`` entries to the cancel log; returns once the broker confirmed all.

    ``dues`` gives the due time of the tasks found waiting.

    ``at`` is the write time the entries state (default: now); only tests
    that stand for an entry written long ago give another.

    Raises:
        PublishError: naming every task id whose cancel may not be recorded.
    """
    written = time.time() if at is None else float(at)
    entries = []
    for task_id, until, reason in items:
        headers: dict[str, Any] = {CANCEL: task_id, UNTIL: float(until), REASON: reason, AT: written,
                                   ENTRY: uuid.uuid4().hex, FORMAT: VERSIONS["cancel"]}
        if dues and task_id in dues:
            headers[DUE] = float(dues[task_id])
        entries.append((headers, task_id))
    _confirmed(raw, layout, entries, timeout)


def record_passes(raw: Connection, layout: IndexLayout, items: Sequence[tuple[str, str, float]], *,
                  reason: str, timeout: float = 30.0) -> None:
    """Append ``(task_id, entry, until)`` pass cancels: that ladder pass of the task must not run (not its id).

    Raises:
        PublishError: naming every task whose pass cancel may not be recorded.
    """
    _confirmed(raw, layout, [({CANCEL_PASS: entry, UNTIL: float(until), REASON: reason, ENTRY: uuid.uuid4().hex,
                               FORMAT: VERSIONS["cancel"]}, task_id) for task_id, entry, until in items], timeout)


def _confirmed(raw: Connection, layout: IndexLayout, entries: Sequence[tuple[dict[str, Any], str | None]],
               timeout: float) -> None:
    failures = append(raw, layout.cancel_queue, entries, timeout=timeout)
    if failures:
        raise combine(failures)


def read_cancel_book(connection: kombu.Connection, layout: IndexLayout, *, now: float | None = None) -> CancelBook:
    """The cancel log of ``layout`` on ``connection``'s broker, read whole into a :class:`CancelBook`.

    Raises:
        IndexUnavailable: the broker has no streams (before RabbitMQ 3.9).
    """
    with reader_connection(connection) as raw:
        return cancel_book_on(raw, layout, now=now)


def cancel_book_on(raw: Connection, layout: IndexLayout, *, now: float | None = None) -> CancelBook:
    """:func:`read_cancel_book` on an open reader connection (a lookup's: its shard, then the log)."""
    book = CancelBook()
    for where in (*still_there(raw, layout), layout):  # a previous shape's cancels hold as well
        load(raw, where, book, now=now)
    return book


def still_there(raw: Connection, layout: IndexLayout) -> list[IndexLayout]:
    """The layouts of ``layout``'s previous shapes whose cancel log is still on the broker (oldest first)."""
    return [old for old in layout.previous if queue_exists(raw, old.cancel_queue)]


def load(raw: Connection, layout: IndexLayout, book: CancelBook, *, now: float | None = None,
         on_unreadable: Callable[[FormatTooNew], None] | None = None) -> int | None:
    """Read the whole cancel log into ``book``; returns the offset the log ended at (its marker's).

    ``on_unreadable`` takes each entry of a newer format instead of the read raising (a worker logs
    it and goes on reading the entries it can).

    Raises:
        FormatTooNew: an entry of a newer format, without ``on_unreadable``.
    """
    now = time.time() if now is None else now
    # Never a start in the future: the reader would never reach its end marker.
    start = datetime.fromtimestamp(max(0.0, min(now, time.time()) - layout.max_age_s), tz=timezone.utc)
    reader = StreamReader(raw, layout.cancel_queue)
    for _offset, headers, _mid in reader.read(start, FIELDS):
        try:
            add(book, headers)
        except FormatTooNew as exc:
            if on_unreadable is None:
                raise
            on_unreadable(exc)
    return reader.end_offset


def add(book: CancelBook, headers: dict[str, Any]) -> str | None:
    """Put one cancel-log entry into ``book``; returns its task id (None for anything else).

    Raises:
        FormatTooNew: the entry is in a newer cancel-log format than this release reads.
    """
    check_format(headers, "cancel")
    entry = headers.get(CANCEL_PASS)
    if entry and headers.get(UNTIL) is not None:
        book.add_pass(str(entry), float(headers[UNTIL]))
        return None
    task_id, until = headers.get(CANCEL), headers.get(UNTIL)
    if not task_id or until is None:
        return None
    due = headers.get(DUE)
    book.add(str(task_id), float(until), float(headers.get(AT) or 0.0), float(due) if due is not None else None)
    return str(task_id)
