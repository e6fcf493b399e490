"""One task's detail (:func:`celery_delayq.index.lookup.waiting_with_passes`) and the lookups' priority over a
read of the whole index (:mod:`celery_delayq.index.priority`), on a real broker."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from celery_delayq import cancel
from celery_delayq.cancels.reschedule import reschedule
from celery_delayq.glue.app_ladder import index_of
from celery_delayq.index import priority, stream
from celery_delayq.index.lookup import TaskNotWaiting, find_waiting, waiting_with_passes
from celery_delayq.index.query import read_index, read_passes


class _Counted:
    """How many reader connections are opened and streams read (one marker per read)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.connections = self.reads = 0
        copy, marker = stream.dedicated_copy, stream.StreamReader.write_marker

        def dedicated_copy(*args: Any, **kwargs: Any) -> Any:
            self.connections += 1
            return copy(*args, **kwargs)

        def write_marker(reader: Any) -> str:
            self.reads += 1
            return marker(reader)

        monkeypatch.setattr(stream, "dedicated_copy", dedicated_copy)
        monkeypatch.setattr(stream.StreamReader, "write_marker", write_marker)

    def take(self) -> tuple[int, int]:
        out, self.connections, self.reads = (self.connections, self.reads), 0, 0
        return out


def test_the_detail_is_find_waiting_and_read_passes_on_one_connection(make_app, monkeypatch) -> None:
    """The detail page's lookup was find_waiting then read_passes: five connections, the shard read twice
    (at 100,000 waiting, while the kept list was re-read, 0.9-1.5 s). Now one connection, the shard and the
    cancel log once each, with the same answer."""
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later(n: int) -> None: ...

    r = later.apply_async((1,), countdown=3600)
    connection, layout = index_of(app)
    counted = _Counted(monkeypatch)
    now = time.time()
    found, passes = waiting_with_passes(connection, layout, r.id, now=now)
    assert counted.take() == (1, 2)
    assert found == find_waiting(connection, layout, [r.id], now=now)[r.id]
    assert passes == read_passes(connection, layout, r.id, now=now) == [found]
    assert counted.take() == (4, 3)  # the two one after the other (read_passes alone: one connection now)

    moved = reschedule(app, r.id, due=time.time() + 7200)  # a second pass: the latest is the one waiting
    found, passes = waiting_with_passes(connection, layout, r.id, now=time.time())
    assert len(passes) == 2 and passes[0].entry == moved.old.entry and passes[-1] == found
    assert found.entry != moved.old.entry and found.due == pytest.approx(moved.due, abs=1)
    assert found == find_waiting(connection, layout, [r.id], now=time.time())[r.id]

    cancel(app, r.id)  # a cancelled task never comes back as waiting
    with pytest.raises(TaskNotWaiting, match="was cancelled"):
        waiting_with_passes(connection, layout, r.id, now=time.time())
    counted.take()
    with pytest.raises(TaskNotWaiting, match="is waiting in the ladder"):
        waiting_with_passes(connection, layout, str(uuid.uuid4()), now=time.time())
    assert counted.take() == (1, 1)  # unknown: the cancel log is not read


def test_a_run_now_task_is_not_waiting_in_its_detail(make_app) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    r = later.apply_async(countdown=3600)
    connection, layout = index_of(app)
    reschedule(app, r.id, due=None)  # run now: its pass in the ladder is cancelled (nothing consumes its queue)
    with pytest.raises(TaskNotWaiting, match="run now or moved"):
        waiting_with_passes(connection, layout, r.id, now=time.time())
    with pytest.raises(TaskNotWaiting, match="run now or moved"):
        find_waiting(connection, layout, [r.id], now=time.time())


def test_a_whole_index_read_waits_for_a_lookup_and_the_lookup_does_not(make_app, monkeypatch) -> None:
    """The web page's background read of the whole index pauses while a lookup of the process runs; a lookup's
    own reads of one shard never pause."""
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    r = later.apply_async(countdown=3600)
    connection, layout = index_of(app)
    monkeypatch.setattr(priority, "MAX_PAUSE_S", 60.0)  # the cap is tested alone (tests/index/test_priority.py)
    release, in_lookup = threading.Event(), threading.Event()
    whole: dict[str, Any] = {}

    def lookup() -> None:
        with priority.urgent():
            in_lookup.set()
            release.wait(30)

    def bulk() -> None:
        found = read_index(connection, layout)
        whole["found"], whole["at"] = found, time.monotonic()

    holder = threading.Thread(target=lookup, daemon=True)
    holder.start()
    assert in_lookup.wait(5)
    reader = threading.Thread(target=bulk, daemon=True)
    reader.start()
    started = time.monotonic()
    with priority.urgent():  # a lookup of its own meanwhile: one shard, at once
        assert r.id in read_index(connection, layout, task_ids=[r.id])
        assert find_waiting(connection, layout, [r.id], now=time.time())[r.id].task_id == r.id
    assert time.monotonic() - started < 10 and reader.is_alive()
    time.sleep(0.3)
    released = time.monotonic()
    release.set()
    reader.join(30)
    holder.join(5)
    assert not reader.is_alive() and r.id in whole["found"]
    assert whole["at"] >= released  # the whole read waited for the lookup to end
