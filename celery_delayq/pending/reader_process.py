"""The web page's reads of the whole index, run in a child process so the web process's GIL stays free.

:class:`ReaderProcess` is a Snapshot ``reader``: a ``spawn`` child (never ``fork``: the web process has threads),
started lazily, paused while the parent looks an id up, sending the list in :data:`CHUNK`-task pickles; its
errors are raised in the parent with the same type and message. A child that dies or does not start within
:data:`_START_S` falls back to reading in this process (for :data:`_RETRY_S`). :meth:`ReaderProcess.close` ends it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..glue.app_ladder import index_of
from ..index.priority import mirror, urgent
from ..index.query import PendingTask
from ..index.writer import flush_buffers
from ..typing import CeleryApp
from .listing import read_pending

__all__ = ["ReaderProcess", "ReaderProcessError", "CHUNK", "chunks"]

log = logging.getLogger(__name__)

#: Tasks per message from the child: unpickling one takes a few milliseconds.
CHUNK = 2000
#: An error of the child's read: (how, the exception pickled or its "module:qualname", message, traceback).
_Report = tuple[str, Any, str, str]
#: Seconds a new child has to say it is ready (spawn, then imports: about a second).
_START_S = 30.0
#: Seconds after a child that did not start before the next is tried (reads run in this process meanwhile).
_RETRY_S = 60.0
#: Seconds between two looks of the child at the parent's count of urgent blocks.
_FOLLOW_S = 0.003
#: Seconds a closed child gets to leave on its own before it is terminated.
_GRACE_S = 0.5


#: Set when this process exits (before multiprocessing ends its daemon children): a read then under way
#: (a background thread's) neither starts a child nor falls back to reading here.
_EXITING = threading.Event()
atexit.register(_EXITING.set)


class ReaderProcessError(RuntimeError):
    """An error of the child's read whose type cannot be made again in this process (named in the message)."""


class _ChildLost(Exception):
    """The child died or its pipe broke (not an error of the read itself)."""


class _NotStarted(_ChildLost):
    """A new child did not say it is ready (it could not start, or ran something else)."""


def chunks(items: Sequence[PendingTask], size: int = CHUNK) -> Iterator[list[PendingTask]]:
    """``items`` in lists of at most ``size`` (none for an empty list)."""
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


class ReaderProcess:
    """``reader(app) -> every waiting task``, as :func:`~celery_delayq.pending.pending(app)` gives them, read
    in a child process (see the module docstring). Reads are one at a time; thread-safe."""

    def __init__(self, *, chunk: int = CHUNK) -> None:
        self.chunk = chunk
        self._lock = threading.Lock()  # one read at a time on the pipe
        self._state = threading.Lock()  # the child and its pipe, for close() while a read waits
        self._proc: BaseProcess | None = None
        self._pipe: Pipe | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._warned = False
        self._closed = False
        self._retry_at = 0.0  # a child that did not start: none is tried again before then (monotonic)

    @property
    def pid(self) -> int | None:
        """The running child's process id (None before the first read and after :meth:`close`)."""
        with self._state:
            return self._proc.pid if self._proc is not None else None

    def __call__(self, app: CeleryApp) -> list[PendingTask]:
        connection, layout = index_of(app)
        flush_buffers()  # this process's own publishes are listed at once (the child has none to flush)
        now = time.time()
        try:
            request = pickle.dumps((connection, layout, now, self.chunk))
        except Exception as exc:  # noqa: BLE001 - e.g. an ssl context: it cannot leave this process
            self._fall_back("cannot be handed the connection", exc, "so does every read")
            return read_pending(connection, layout, now=now)
        with self._lock:
            answer = self._ask(request)
        if answer is None:
            return read_pending(connection, layout, now=now)
        items, error = answer
        if error is not None:
            raise _rebuilt(error)
        return items

    def close(self) -> None:
        """End the child (a read under way then runs in this process); later reads run in this process."""
        self._closed = True
        self._stop()

    # -- the parent's side ------------------------------------------------------------------------
    def _ask(self, request: bytes) -> tuple[list[PendingTask], _Report | None] | None:
        """The child's answer to ``request``; None when this read is to run in this process."""
        if self._closed or time.monotonic() < self._retry_at:
            return None
        try:
            if _EXITING.is_set():
                raise _ChildLost("this process is exiting")
            pipe = self._started()
            pipe.send_bytes(request)
            return self._receive(pipe)
        except Exception as exc:  # noqa: BLE001 - could not start, or died: this read runs here
            self._stop()
            if _EXITING.is_set():
                raise ReaderProcessError("no read of the index: this process is exiting") from exc
            if not self._closed:
                if isinstance(exc, _NotStarted):
                    self._fall_back("did not start", exc, f"a new one is tried in {_RETRY_S:g} s")
                else:
                    self._fall_back("died", exc, "the next read starts a new one")
            return None

    def _started(self) -> Pipe:
        """The running child's pipe; else a new child's, once it said it is ready (:class:`_NotStarted`)."""
        with self._state:
            if self._proc is not None and self._pipe is not None and self._proc.is_alive():
                return self._pipe
        self._stop()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        counter = ctx.RawValue("i", 0)  # this process's urgent blocks: the child's reads pause for them too
        proc = ctx.Process(target=serve, args=(child, counter), name="delayq-index-reader", daemon=True)
        finalizer = weakref.finalize(self, _end, proc, parent, mirror(counter))
        finalizer.atexit = False  # at exit multiprocessing ends its daemons (after _EXITING is set)
        try:
            try:
                proc.start()
            finally:
                child.close()
            # A child that re-runs a script without a __main__ guard may exit, or serve that script for ever:
            # wait for its word, and try again only after a while.
            if not parent.poll(_START_S) or pickle.loads(parent.recv_bytes())[0] != "ready":
                raise _NotStarted(f"no word from it within {_START_S:g} s")
        except Exception as exc:
            finalizer()
            self._retry_at = time.monotonic() + _RETRY_S
            if isinstance(exc, _NotStarted):
                raise
            raise _NotStarted(f"{type(exc).__name__}: {exc}") from exc
        with self._state:
            if not self._closed:
                self._proc, self._pipe, self._finalizer = proc, parent, finalizer
                return parent
        finalizer()  # closed while it started
        raise _ChildLost("closed")

    @staticmethod
    def _receive(pipe: Pipe) -> tuple[list[PendingTask], _Report | None]:
        """``(the list, None)`` or ``([], the child's error report)``; :class:`_ChildLost` if the pipe broke."""
        items: list[PendingTask] = []
        while True:
            try:
                data = pipe.recv_bytes()
            except (EOFError, OSError) as exc:
                raise _ChildLost(f"the pipe closed ({type(exc).__name__})") from exc
            kind, payload = pickle.loads(data)  # one chunk: a few milliseconds of GIL
            if kind == "items":
                items.extend(payload)
            elif kind == "done":
                return items, None
            elif kind == "error":
                return [], payload
            else:
                raise _ChildLost(f"unexpected message {kind!r}")

    def _stop(self) -> None:
        with self._state:
            finalizer, self._proc, self._pipe, self._finalizer = self._finalizer, None, None, None
        if finalizer is not None:
            finalizer()

    def _fall_back(self, why: str, exc: BaseException, then: str) -> None:
        """Say (at WARNING the first time, then at DEBUG) why this read runs in this process."""
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        log.log(level, "delayq: the index reader process %s (%s: %s): this read of the index runs in the web "
                "process; %s", why, type(exc).__name__, exc, then)


def _end(proc: BaseProcess, pipe: Pipe, unmirror: Callable[[], None]) -> None:
    """Close the pipe (the child leaves at its next wait for a request), then make sure it has gone."""
    unmirror()
    with contextlib.suppress(Exception):
        pipe.close()
    with contextlib.suppress(Exception):
        proc.join(_GRACE_S)
        if proc.is_alive():
            proc.terminate()  # mid-read: nothing it does needs finishing (a read only looks)
            proc.join(_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(_GRACE_S)


# -- errors across the pipe ---------------------------------------------------------------------------


def _report(exc: BaseException) -> _Report:
    """What the parent needs to raise ``exc`` again: the exception pickled when it survives that, else its name."""
    text = "".join(traceback.format_exception(exc))
    with contextlib.suppress(Exception):
        blob = pickle.dumps(exc)
        back = pickle.loads(blob)
        if type(back) is type(exc) and str(back) == str(exc):
            return "pickled", blob, str(exc), text
    return "named", f"{type(exc).__module__}:{type(exc).__qualname__}", str(exc), text


def _rebuilt(report: _Report) -> BaseException:
    """The child's exception, made again here: the same type and message, or a :class:`ReaderProcessError`."""
    how, what, message, text = report
    exc: BaseException | None = None
    if how == "pickled":
        with contextlib.suppress(Exception):
            exc = pickle.loads(what)
    else:
        with contextlib.suppress(Exception):
            module, _, name = str(what).partition(":")
            cls: Any = importlib.import_module(module)
            for part in name.split("."):
                cls = getattr(cls, part)
            if isinstance(cls, type) and issubclass(cls, Exception):
                made = cls.__new__(cls)
                made.args = (message,)
                exc = made if str(made) == message else None
    if exc is None:
        exc = ReaderProcessError(f"{what if how == 'named' else 'error'}: {message}")
    exc.add_note(f"raised in the index reader process:\n{text.rstrip()}")
    return exc


# -- the child's side ---------------------------------------------------------------------------------
def serve(pipe: Pipe, counter: Any = None) -> None:
    """The child: read the index for every request on ``pipe``, answer in chunks; leave when the pipe closes.

    ``counter``: the parent's count of urgent blocks (:func:`~celery_delayq.index.priority.mirror`), followed
    here so that a read pauses while the parent looks an id up, as it would in the parent.
    """
    with contextlib.suppress(Exception):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the web process's to handle (it closes us)
    reading = threading.Event()
    if counter is not None:
        threading.Thread(target=_follow, args=(counter, reading), name="delayq-urgent-follower", daemon=True).start()
    try:
        pipe.send_bytes(pickle.dumps(("ready", os.getpid())))
    except (EOFError, OSError):
        return
    while True:
        try:
            request = pipe.recv_bytes()
        except (EOFError, OSError):
            return  # the parent closed its end, or is gone
        try:
            connection, layout, now, size = pickle.loads(request)
            reading.set()
            items = read_pending(connection, layout, now=now)
        except Exception as exc:  # noqa: BLE001 - every error of the read goes back to be raised there
            answer: Iterable[bytes] = [pickle.dumps(("error", _report(exc)))]
        else:
            answer = _answer(items, size)
        finally:
            reading.clear()
        try:
            for data in answer:
                pipe.send_bytes(data)
        except (EOFError, OSError):
            return


def _follow(counter: Any, reading: threading.Event, stop: threading.Event | None = None) -> None:
    """Be in an urgent block while the parent is in one (checked every :data:`_FOLLOW_S` seconds while
    ``reading`` is set: an idle child does not wake up 300 times a second)."""
    stop = stop or threading.Event()
    while not stop.is_set():
        if not reading.wait(0.5):
            continue
        if counter.value:
            with urgent():
                while counter.value and not stop.is_set():
                    time.sleep(_FOLLOW_S)
        time.sleep(_FOLLOW_S)


def _answer(items: list[PendingTask], size: int) -> Iterator[bytes]:
    """The messages of one answer: the chunks, pickled as they are sent (the parent unpickles one meanwhile)."""
    for part in chunks(items, size):
        yield pickle.dumps(("items", part))
    yield pickle.dumps(("done", len(items)))
