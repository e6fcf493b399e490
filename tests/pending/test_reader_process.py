"""The web page's whole-index reads in a child process (:mod:`celery_delayq.pending.reader_process`).

Pure first (the chunks and the errors across a pipe, with the child's loop in a thread), then on the
broker with a real spawned child: the same list as ``pending(app)``, the same errors, a killed child
replaced, a child that dies mid-read falls back to this process, and no child after ``close``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Iterator

import pytest

from celery_delayq import cancel, pending
from celery_delayq.cancels.reschedule import reschedule
from celery_delayq.index import IndexUnavailable
from celery_delayq.index.query import PendingTask
from celery_delayq.index.stream import StreamReadError
from celery_delayq.pending import reader_process as rp
from celery_delayq.pending.reader_process import ReaderProcess, ReaderProcessError, chunks


def _task(i: int) -> PendingTask:
    return PendingTask(f"id-{i:05d}", "proj.job", "", "q", "q", 1e10 + i, i % 3, f"e{i}", f"({i},)", "{}",
                       "ValueError: no" if i % 3 else None)


# -- pure -------------------------------------------------------------------------------------------
def test_chunks_cut_the_list_in_order() -> None:
    items = [_task(i) for i in range(5)]
    assert [len(c) for c in chunks(items, 2)] == [2, 2, 1]
    assert [t for c in chunks(items, 2) for t in c] == items
    assert list(chunks([], 2)) == []


@pytest.fixture
def looped(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The child's loop (:func:`serve`) in a thread of this process, its read replaced by ``read``."""
    parent, child = multiprocessing.Pipe()
    box: dict[str, Any] = {}
    monkeypatch.setattr(rp, "read_pending", lambda connection, layout, *, now: box["read"]())
    thread = threading.Thread(target=rp.serve, args=(child,), daemon=True)
    thread.start()
    assert rp.pickle.loads(parent.recv_bytes()) == ("ready", os.getpid())  # its first word

    def ask(read: Any, size: int = 2) -> tuple[list[PendingTask], Any]:
        box["read"] = read
        parent.send_bytes(rp.pickle.dumps(("connection", "layout", 0.0, size)))
        return ReaderProcess._receive(parent)

    yield ask
    parent.close()
    thread.join(5)
    assert not thread.is_alive()  # the loop leaves when the pipe closes


def test_the_list_comes_back_in_chunks(looped: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    answer = rp._answer

    def counted(items: list[PendingTask], size: int) -> Iterator[bytes]:
        for data in answer(items, size):
            sent.append(len(data))
            yield data

    monkeypatch.setattr(rp, "_answer", counted)
    items = [_task(i) for i in range(5)]
    assert looped(lambda: items, 2) == (items, None)
    assert len(sent) == 4  # three chunks and the end
    assert looped(lambda: []) == ([], None)


class _TwoArgs(Exception):
    def __init__(self, a: str, b: int) -> None:
        super().__init__(f"{a} x{b}")


def test_errors_come_back_with_their_type_and_message(looped: Any) -> None:
    def fails(exc: Exception) -> Any:
        def read() -> Any:
            raise exc
        return read

    for exc in (IndexUnavailable("the index is off"), StreamReadError("stalled at 12"), KeyError("k"),
                _TwoArgs("odd", 2)):  # _TwoArgs does not unpickle: made again from its name and message
        items, report = looped(fails(exc))
        again = rp._rebuilt(report)
        assert items == [] and type(again) is type(exc) and str(again) == str(exc)
        assert "raised in the index reader process" in again.__notes__[0] and "Traceback" in again.__notes__[0]

    class Local(Exception):
        def __init__(self, a: str, b: int) -> None:
            super().__init__(f"{a}/{b}")

    again = rp._rebuilt(looped(fails(Local("x", 1)))[1])  # a type the parent cannot name: said in words
    assert type(again) is ReaderProcessError and "Local" in str(again) and "x/1" in str(again)
    assert looped(lambda: [_task(1)]) == ([_task(1)], None)  # the child goes on after an error


def test_a_connection_that_cannot_leave_the_process_is_read_here(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """An ssl context (say) does not pickle: that read runs in this process, and no child is started."""
    monkeypatch.setattr(rp, "index_of", lambda app: (threading.Lock(), "layout"))
    monkeypatch.setattr(rp, "read_pending", lambda connection, layout, *, now: [_task(1)])
    reader = ReaderProcess()
    with caplog.at_level(logging.WARNING, logger=rp.__name__):
        assert reader(None) == reader(None) == [_task(1)]
    assert reader.pid is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1  # once


def test_the_child_follows_the_parents_urgent_blocks() -> None:
    """A lookup in the parent (urgent()) pauses the child's read as it would pause one in the parent."""
    from celery_delayq.index import priority

    shared = multiprocessing.get_context("spawn").RawValue("i", 0)
    unmirror = priority.mirror(shared)
    with priority.urgent():
        assert shared.value == 1
        with priority.urgent():  # nested: counted once
            assert shared.value == 1
    assert shared.value == 0
    unmirror()
    with priority.urgent():
        assert shared.value == 0  # no longer mirrored

    stop, reading = threading.Event(), threading.Event()
    follower = threading.Thread(target=rp._follow, args=(shared, reading, stop), daemon=True)
    follower.start()
    try:
        shared.value = 1
        time.sleep(0.05)
        assert priority.urgent_now() == 0  # no read under way: not followed
        reading.set()
        for value, urgent_here in ((1, 1), (0, 0)):
            shared.value = value  # as the parent would
            deadline = time.monotonic() + 2
            while priority.urgent_now() != urgent_here and time.monotonic() < deadline:
                time.sleep(0.005)
            assert priority.urgent_now() == urgent_here
    finally:
        stop.set()
        follower.join(2)


# -- broker, a real child ---------------------------------------------------------------------------
@pytest.fixture
def reader() -> Iterator[ReaderProcess]:
    r = ReaderProcess()
    yield r
    r.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _mine(app: Any, items: list[PendingTask]) -> list[PendingTask]:
    return [t for t in items if (t.task_name or "").startswith(f"{app.main}.")]


def test_the_child_lists_what_pending_lists(make_app, reader: ReaderProcess) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later(n: int) -> None: ...

    kept = [later.apply_async((i,), countdown=600 + i) for i in range(5)]
    cancelled = later.apply_async((10,), countdown=700)
    moved = later.apply_async((11,), countdown=800)
    run_now = later.apply_async((12,), countdown=900)
    cancel(app, cancelled.id)
    reschedule(app, moved.id, due=time.time() + 3000)  # a second pass: the first is superseded
    reschedule(app, run_now.id, due=None)  # its pass is cancelled (nothing consumes its queue)
    here = _mine(app, pending(app))
    there = _mine(app, reader(app))
    assert reader.pid is not None and there == here
    assert [t.task_id for t in there] == [*(r.id for r in kept), moved.id]
    assert there[-1].due == pytest.approx(time.time() + 3000, abs=30)
    pid = reader.pid
    assert _mine(app, reader(app)) == here and reader.pid == pid  # the same child reads again


def test_errors_of_the_child_are_pendings_errors(make_app, reader: ReaderProcess) -> None:
    off = make_app(delayq_enabled=True, delayq_index=False)
    undeclared = make_app(delayq_enabled=True, delayq_prefix=f"nodecl{off.main}")  # no ladder, no index
    for app in (off, undeclared):
        with pytest.raises(IndexUnavailable) as here:
            pending(app)
        with pytest.raises(IndexUnavailable) as there:
            reader(app)
        assert str(there.value) == str(here.value)
        assert "raised in the index reader process" in there.value.__notes__[0]
    assert reader.pid is not None  # the errors came from the child, which is still there


def test_a_killed_child_is_replaced(make_app, reader: ReaderProcess) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    r = later.apply_async(countdown=600)
    assert [t.task_id for t in _mine(app, reader(app))] == [r.id]
    first = reader.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not _gone(first) and reader._proc is not None and reader._proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [t.task_id for t in _mine(app, reader(app))] == [r.id]
    assert reader.pid not in (None, first)


def test_a_child_that_dies_mid_read_falls_back_to_this_process(make_app, reader: ReaderProcess,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    r = later.apply_async(countdown=600)
    started = ReaderProcess._started
    killed: list[int] = []

    def dies(self: ReaderProcess) -> Any:
        pipe = started(self)
        if not killed:
            assert self._proc is not None and self._proc.pid is not None
            killed.append(self._proc.pid)
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.join(5)
        return pipe

    monkeypatch.setattr(ReaderProcess, "_started", dies)
    with caplog.at_level(logging.WARNING, logger=rp.__name__):
        assert [t.task_id for t in _mine(app, reader(app))] == [r.id]  # read here instead
    assert reader.pid is None and [rec.levelno for rec in caplog.records] == [logging.WARNING]
    assert [t.task_id for t in _mine(app, reader(app))] == [r.id]
    assert reader.pid not in (None, *killed)  # the next read started a new child


def test_a_child_that_does_not_start_is_not_tried_again_at_once(make_app, reader: ReaderProcess,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Spawn runs the parent's script again: one without a __main__ guard may exit or never answer. No word
    within the time: ended, that read and those of the next minute run here, then a new child is tried."""
    app = make_app(delayq_enabled=True)
    monkeypatch.setattr(rp, "_START_S", 0.0)
    with caplog.at_level(logging.WARNING, logger=rp.__name__):
        assert _mine(app, reader(app)) == _mine(app, pending(app)) and reader.pid is None
        assert "did not start" in caplog.records[0].getMessage()
        reader(app)
    assert len(caplog.records) == 1 and reader._retry_at > time.monotonic() + 50  # no second child meanwhile
    monkeypatch.setattr(rp, "_START_S", 30.0)
    reader._retry_at = 0.0
    reader(app)
    assert reader.pid is not None


def test_no_child_after_close(make_app, reader: ReaderProcess) -> None:
    app = make_app(delayq_enabled=True)
    reader(app)
    pid = reader.pid
    assert pid is not None and not _gone(pid)
    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < 2 and reader.pid is None and _gone(pid)
    reader(app)  # read in this process from now on: no new child
    assert reader.pid is None
