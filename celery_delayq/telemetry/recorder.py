"""Buffered, fail-safe JSON Lines recorder for delayed-task telemetry.

* ``record()``/``record_event()`` never block on I/O and never raise: they append to a
  lock-free buffer and a daemon thread encodes and writes.
* Telemetry is expendable: events that cannot be written are dropped, counted in
  :attr:`TelemetryRecorder.dropped` and warned about (rate-limited); the task never notices.
* Files land in a Hive-style layout, partitioned by the event's own ``ts`` (UTC), one file
  per process: ``root/date=YYYY-MM-DD/hour=HH/events-<hostname>-<pid>-<uuid8>.jsonl``.

Event contract (what :func:`make_event` builds and the analytics job reads): ``event``,
``task_id``, ``task_name``, ``queue``, ``attempt`` (0 for the first run), ``ts`` (epoch
seconds), then each type's fields (:mod:`~celery_delayq.telemetry.events`); extras are ignored.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import json.encoder
import logging
import math
import os
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Final

from .events import (
    EVENT_CLASSES,
    EVENT_TYPES,
    Delivered,
    Exhausted,
    Failed,
    Parked,
    Retried,
    Scheduled,
    Succeeded,
    TelemetryEvent,
)

__all__ = ["TelemetryRecorder", "encode_event", "make_event", "recorder_for", "flush_all"]

logger = logging.getLogger(__name__)

_HOSTNAME = socket.gethostname().replace(os.sep, "_") or "localhost"


def make_event(
    event: str,
    *,
    task_id: str,
    task_name: str,
    queue: str,
    attempt: int,
    ts: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Build one telemetry event dict following the event contract.

    Core fields are coerced to their contract types; ``ts`` defaults to now; an
    ``exception`` given as instance or class is stored as its type name; other extras as
    they are. Raises :class:`ValueError` for an unknown ``event`` name.
    """
    if event not in EVENT_TYPES:
        raise ValueError(f"unknown telemetry event {event!r}; expected one of {EVENT_TYPES}")
    record: dict[str, Any] = {
        "event": event,
        "task_id": str(task_id),
        "task_name": str(task_name),
        "queue": str(queue),
        "attempt": int(attempt),
        "ts": float(time.time() if ts is None else ts),
    }
    exc = extra.get("exception")
    if isinstance(exc, BaseException):
        extra["exception"] = type(exc).__name__
    elif isinstance(exc, type):
        extra["exception"] = exc.__name__
    record.update(extra)
    return record


# One reusable encoder (json.dumps with options builds one per call); what json cannot
# encode is recorded as text; NaN/inf are refused (not JSON); a cycle fails as RecursionError.
_ENCODE = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False, check_circular=False).encode

# The fast path (docs/operations.md, "Recording overhead"): record_event() buffers the named
# tuple and the writer formats it with one f-string per type, byte for byte what
# _ENCODE(make_event(...)) gives; anything else takes that generic path.

#: Fields of each event type after the core ones, in tuple order.
TASK_EVENT_EXTRAS: dict[str, tuple[str, ...]] = {
    cls.event: cls._fields[5:] for cls in EVENT_CLASSES
}
#: The named tuple of each event name.
EVENT_CLASS: dict[str, type[Any]] = {cls.event: cls for cls in EVENT_CLASSES}
# Extras coerced with float() (as the worker hooks always did).
_FLOAT_EXTRAS = frozenset({"delay_s", "due_at"})

_q = json.encoder.encode_basestring_ascii  # C: quoted, escaped, ASCII-only (as _ENCODE)


# The formatters print only what they can print exactly as _ENCODE(make_event(...))
# would: str fields, an int attempt (not a bool: make_event stores int(True) = 1)
# and finite floats (an int ts would lose the ".0" make_event's float() adds; NaN
# and inf aren't JSON).  ``x - x`` is 0.0 (falsy) for a finite float, NaN otherwise.
# Anything else raises _Unprintable and takes the generic path.


class _Unprintable(Exception):
    pass


def _delay_formatter(event: str) -> Callable[[Any], str]:
    """The line of a lateness event: the core fields, ``delay_s`` and ``due_at``, then (scheduled) ``entry``
    and ``hops``."""
    head = f'{{"event":"{event}","task_id":'

    def line(item: Any) -> str:
        task_id, task_name, queue, attempt, ts, delay_s, due_at = item[:7]
        if (attempt.__class__ is not int or ts.__class__ is not float
                or delay_s.__class__ is not float or due_at.__class__ is not float
                or ts - ts or delay_s - delay_s or due_at - due_at):
            raise _Unprintable
        tail = ""
        if len(item) > 7:
            entry, hops = item[7:]
            if hops.__class__ is not int:
                raise _Unprintable
            tail = f',"entry":{_q(entry)},"hops":{hops}'
        return (
            f'{head}{_q(task_id)},"task_name":{_q(task_name)},"queue":{_q(queue)},"attempt":{attempt},'
            f'"ts":{ts!r},"delay_s":{delay_s!r},"due_at":{due_at!r}{tail}}}\n'
        )

    return line


def _line_succeeded(item: Succeeded) -> str:
    task_id, task_name, queue, attempt, ts = item
    if attempt.__class__ is not int or ts.__class__ is not float or ts - ts:
        raise _Unprintable
    return (
        f'{{"event":"succeeded","task_id":{_q(task_id)},"task_name":{_q(task_name)},'
        f'"queue":{_q(queue)},"attempt":{attempt},"ts":{ts!r}}}\n'
    )


def _failure_formatter(event: str) -> Callable[[Any], str]:
    head = f'{{"event":"{event}","task_id":'

    def line(item: Any) -> str:
        task_id, task_name, queue, attempt, ts, exception = item
        if attempt.__class__ is not int or ts.__class__ is not float or ts - ts:
            raise _Unprintable
        return (
            f'{head}{_q(task_id)},"task_name":{_q(task_name)},"queue":{_q(queue)},'
            f'"attempt":{attempt},"ts":{ts!r},"exception":{_q(exception)}}}\n'
        )

    return line


# Keyed by class: the writer looks the formatter up with item.__class__.  The
# rare events (replayed, cancelled) take the generic path.
_FAST_LINES: dict[type, Callable[[Any], str]] = {
    Scheduled: _delay_formatter("scheduled"),
    Delivered: _delay_formatter("delivered"),
    Succeeded: _line_succeeded,
    Retried: _failure_formatter("retried"),
    Exhausted: _failure_formatter("exhausted"),
    Parked: _failure_formatter("parked"),
    Failed: _failure_formatter("failed"),
}


def event_dict(event: TelemetryEvent) -> dict[str, Any]:
    """The dict :func:`make_event` builds for ``event`` (what its JSON line holds)."""
    cls = event.__class__
    if EVENT_CLASS.get(str(getattr(cls, "event", ""))) is not cls:
        raise ValueError(f"not a telemetry event: {cls.__name__}")
    task_id, task_name, queue, attempt, ts, *extra = event
    extras = {
        name: float(value) if name in _FLOAT_EXTRAS else value  # type: ignore[arg-type]
        for name, value in zip(cls._fields[5:], extra)
    }
    return make_event(
        cls.event, task_id=task_id, task_name=task_name, queue=queue, attempt=attempt, ts=ts,
        **extras,
    )


def encode_event(event: TelemetryEvent) -> str:
    """The line (with its ``\\n``) the recorder writes for ``event``.

    Raises ``TypeError``/``ValueError`` (or ``RecursionError``) for an event
    that can't be recorded, exactly when ``_ENCODE(make_event(...))`` would.
    """
    try:
        return _FAST_LINES[event.__class__](event)
    except Exception:  # not printable as is: coerce (or fail) the make_event way
        return _ENCODE(event_dict(event)) + "\n"


#: Lines per write() call when a batch is appended to its file.
_WRITE_CHUNK = 512


class TelemetryRecorder:
    """Append telemetry events as JSON Lines under a date/hour partitioned root.

    Args:
        root: Where ``date=.../hour=...`` partitions are made (lazily; failing only drops telemetry).
        flush_every: Wake the writer once this many events are buffered.
        flush_interval_s: The writer also flushes this often.
        max_buffer: Cap on buffered events; past it the **newest** are dropped (O(1), keeps order).
        clock: Epoch seconds, for events without a usable ``ts`` and for rate-limiting warnings.
        warn_every_s: Least seconds between two warnings about dropped events.

    Thread-safe (the cap may be overshot by a few events) and fork-safe: a forked child starts
    with an empty buffer, fresh counters and file name. Flushed at :meth:`close` and at exit.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        flush_every: int = 4096,
        flush_interval_s: float = 1.0,
        max_buffer: int = 100_000,
        clock: Callable[[], float] = time.time,
        warn_every_s: float = 60.0,
    ) -> None:
        if flush_every < 1:
            raise ValueError("flush_every must be >= 1")
        if max_buffer < 1:
            raise ValueError("max_buffer must be >= 1")
        if not flush_interval_s > 0:
            raise ValueError("flush_interval_s must be > 0")
        #: The directory the partitions are written under.
        self.root: Final[str] = os.fspath(root)
        self._flush_every = flush_every
        self._flush_interval_s = float(flush_interval_s)
        self._max_buffer = max_buffer
        self._clock = clock
        self._warn_every_s = float(warn_every_s)
        self._closed = False
        self._init_process_state()
        _LIVE_RECORDERS.add(self)

    # -- per-process state -------------------------------------------------

    def _init_process_state(self) -> None:
        """(Re)create everything that must not be shared across a fork: a forked child takes no events, file
        or locks from its parent (which flushes what it buffered)."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # batches hit the file in record order
        self._wake = threading.Event()
        # Producers append on the right without a lock; only a flush (under _flush_lock) pops
        # on the left. Items are event dicts (record) or named tuples (record_event).
        self._buffer: deque[Any] = deque()
        self._written = 0
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._thread_claimed = False
        self._stopping = False
        self._last_warning = -math.inf
        self._suppressed_warnings = 0
        self._partitions: dict[int, tuple[str, str]] = {}
        #: Base name of this process's file inside each partition directory.
        self.filename = f"events-{_HOSTNAME}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"

    @property
    def written(self) -> int:
        """Number of events successfully written by this process."""
        return self._written

    @property
    def dropped(self) -> int:
        """Number of events this process discarded (buffer full, I/O error, unserialisable, or recorded
        after :meth:`close`)."""
        return self._dropped

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (events recorded now are dropped)."""
        return self._closed

    @property
    def buffered(self) -> int:
        """Number of events waiting to be written."""
        return len(self._buffer)

    def record(self, event: Mapping[str, Any]) -> None:
        """Queue (a shallow copy of) one event for writing. Never blocks on I/O, never raises."""
        try:
            item = dict(event)
        except Exception:  # not a mapping: count it, don't break the caller
            self._drop(1, "telemetry event is not a mapping: %r", type(event).__name__)
            return
        self._enqueue(item)

    def record_event(self, event: TelemetryEvent) -> None:
        """Queue one event (a named tuple of :mod:`~celery_delayq.telemetry.events`); never blocks, never raises.

        The writer thread writes the line ``record(make_event(...))`` would. Pass only
        immutable values: another thread reads them later.
        """
        buf = self._buffer
        if self._closed or len(buf) >= self._max_buffer or not self._thread_claimed:
            self._enqueue(event)
            return
        buf.append(event)
        if len(buf) >= self._flush_every:
            self._after_append(len(buf))

    def _enqueue(self, item: Any) -> None:
        """Buffer one item, with every check; the slow twin of record_event's fast path."""
        if self._closed:
            with self._lock:
                self._dropped += 1
            return
        buf = self._buffer
        if len(buf) >= self._max_buffer:
            with self._lock:
                self._dropped += 1
            self._warn(
                "telemetry buffer full (%d events); dropping newest events", self._max_buffer
            )
            return
        buf.append(item)
        if not self._thread_claimed:
            with self._lock:  # lazily: a prefork parent needs no thread
                start_thread, self._thread_claimed = not self._thread_claimed, True
            if start_thread:
                self._start_thread()
        self._after_append(len(buf))

    def _after_append(self, size: int) -> None:
        if self._closed:  # close() ran after our check and may have flushed: write the straggler
            self.flush()
        elif size >= self._flush_every:
            if self._thread is None:  # no writer thread (interpreter shutdown): flush inline
                self.flush()
            elif not self._wake.is_set():
                self._wake.set()

    def flush(self) -> None:
        """Write all buffered events now; what cannot be written is dropped and counted. Never raises."""
        try:
            with self._flush_lock:
                buf = self._buffer
                pop = buf.popleft
                # Only flushes pop, and they hold _flush_lock: these items exist.
                batch = [pop() for _ in range(len(buf))]
                if batch:
                    self._write(batch)
        except Exception:  # last-resort guard: telemetry must not take the caller down
            logger.exception("unexpected error while flushing telemetry")

    def close(self) -> None:
        """Stop the writer thread and flush what is buffered (idempotent); later events are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            # Bounded: a wedged filesystem must not hang interpreter exit.
            thread.join(timeout=self._flush_interval_s + 5.0)
        self.flush()
        _LIVE_RECORDERS.discard(self)

    def __enter__(self) -> TelemetryRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TelemetryRecorder root={self.root!r} written={self._written} dropped={self._dropped}>"

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._run, name="celery-delayq-telemetry", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # at interpreter shutdown: record() flushes inline instead
            return
        with self._lock:
            self._thread = thread

    def _run(self) -> None:
        wake = self._wake
        while True:
            wake.wait(self._flush_interval_s)
            wake.clear()
            stopping = self._stopping
            self.flush()
            if stopping:
                return

    def _partition_span(self, ts: Any) -> tuple[tuple[str, str], float, float]:
        """The ``(YYYY-MM-DD, HH)`` UTC partition of ``ts`` and its ``[start, end)`` (empty if ``ts`` is unusable)."""
        try:
            t = float(ts)
            if not math.isfinite(t):
                raise ValueError(ts)
            hour = int(t // 3600)
            cached = self._partitions.get(hour)
            if cached is not None:
                return cached, hour * 3600.0, (hour + 1) * 3600.0
            moment = datetime.fromtimestamp(hour * 3600, tz=timezone.utc)
        except (TypeError, ValueError, OverflowError, OSError):
            # Missing or absurd ts: file it under "now" rather than losing it.
            hour = int(self._safe_now() // 3600)
            moment = datetime.fromtimestamp(hour * 3600, tz=timezone.utc)
            key = self._partitions.get(hour) or (moment.strftime("%Y-%m-%d"), moment.strftime("%H"))
            self._partitions[hour] = key
            return key, math.inf, -math.inf
        key = (moment.strftime("%Y-%m-%d"), moment.strftime("%H"))
        if len(self._partitions) > 4096:
            self._partitions.clear()
        self._partitions[hour] = key
        return key, hour * 3600.0, (hour + 1) * 3600.0

    def _write(self, batch: list[Any]) -> None:
        groups: dict[tuple[str, str], list[str]] = {}
        unserialisable = 0
        fast_lines = _FAST_LINES
        # The hour of the previous event: consecutive events nearly always share it.
        lines: list[str] = []
        start, end = math.inf, -math.inf
        for item in batch:
            try:
                if item.__class__ is dict:
                    line = _ENCODE(item) + "\n"
                    ts = item.get("ts")
                else:
                    try:
                        line = fast_lines[item.__class__](item)
                        ts = item[4]
                    except Exception:  # rare event or not printable as is: the make_event way
                        item = event_dict(item)
                        line = _ENCODE(item) + "\n"
                        ts = item["ts"]
            except Exception:  # TypeError, ValueError, RecursionError, or a str() that raised
                unserialisable += 1
                continue
            try:
                same_hour = start <= ts < end  # type: ignore[operator]
            except TypeError:  # ts missing or not a number
                same_hour = False
            if not same_hour:
                key, start, end = self._partition_span(ts)
                lines = groups.setdefault(key, [])
            lines.append(line)
        if unserialisable:
            self._drop(unserialisable, "dropped %d unserialisable telemetry event(s)", unserialisable)
        for (date, hour), lines in groups.items():
            directory = os.path.join(self.root, f"date={date}", f"hour={hour}")
            path = os.path.join(directory, self.filename)
            try:
                os.makedirs(directory, exist_ok=True)
                self._append(path, lines)
            except OSError as exc:
                self._drop(len(lines), "cannot write telemetry to %s (%s); dropped %d event(s)", path, exc, len(lines))
            else:
                with self._lock:
                    self._written += len(lines)

    @staticmethod
    def _append(path: str, lines: list[str]) -> None:
        """Append ``lines`` (each ending with a newline) to ``path``, all or nothing."""
        with open(path, "a", encoding="utf-8") as fh:
            start = fh.tell()
            try:
                # In slices: one multi-megabyte string per batch costs more in page faults than formatting.
                for i in range(0, len(lines), _WRITE_CHUNK):
                    fh.write("".join(lines[i : i + _WRITE_CHUNK]))
                fh.flush()
            except OSError:  # roll back a partial line, or the next batch would be glued onto it
                with contextlib.suppress(OSError):
                    os.truncate(path, start)
                raise

    def _safe_now(self) -> float:
        try:
            return float(self._clock())
        except Exception:
            return time.time()

    def _drop(self, count: int, msg: str, *args: object) -> None:
        with self._lock:
            self._dropped += count
        self._warn(msg, *args)

    def _warn(self, msg: str, *args: object) -> None:
        now = self._safe_now()
        with self._lock:
            if now - self._last_warning < self._warn_every_s:
                self._suppressed_warnings += 1
                return
            self._last_warning = now
            suppressed, self._suppressed_warnings = self._suppressed_warnings, 0
        if suppressed:
            msg += " (%d similar warning(s) suppressed)"
            args = (*args, suppressed)
        logger.warning(msg, *args)


# Recorders to flush at exit and re-initialise after fork (weak: short-lived ones do not pile up).
_LIVE_RECORDERS: weakref.WeakSet[TelemetryRecorder] = weakref.WeakSet()


_SHARED: dict[str, TelemetryRecorder] = {}
_SHARED_LOCK = threading.Lock()


def recorder_for(root: str | os.PathLike[str]) -> TelemetryRecorder:
    """The process's recorder for a telemetry directory, shared by every app writing there (one file per
    partition); created on first use, and again after a close."""
    key = os.fspath(root)
    rec = _SHARED.get(key)
    if rec is not None and not rec.closed:
        return rec
    with _SHARED_LOCK:
        rec = _SHARED.get(key)
        if rec is None or rec.closed:  # a closed one drops everything: start afresh
            rec = _SHARED[key] = TelemetryRecorder(key)
        return rec


def flush_all() -> None:
    """Write out every buffered event of this process now (tests, shutdown hooks)."""
    for recorder in list(_LIVE_RECORDERS):
        recorder.flush()


def _close_all() -> None:
    for recorder in list(_LIVE_RECORDERS):
        recorder.close()


def _reinit_all_after_fork() -> None:
    for recorder in list(_LIVE_RECORDERS):
        recorder._init_process_state()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):  # POSIX only
    os.register_at_fork(after_in_child=_reinit_all_after_fork)
