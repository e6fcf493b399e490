"""A whole-index read pauses while a lookup of the same process runs (:mod:`celery_delayq.index.priority`; pure)."""

from __future__ import annotations

import threading
import time

from celery_delayq.index.priority import Pause, urgent, urgent_now


def _hold(seconds: float) -> tuple[threading.Thread, threading.Event]:
    """A lookup in another thread: urgent for ``seconds``; the event is set once it is under way."""
    under_way = threading.Event()

    def lookup() -> None:
        with urgent():
            under_way.set()
            time.sleep(seconds)

    t = threading.Thread(target=lookup, daemon=True)
    t.start()
    assert under_way.wait(5)
    return t, under_way


def test_a_bulk_read_waits_while_a_lookup_runs_and_goes_on_when_it_ends() -> None:
    pause = Pause(budget=10.0)
    started = time.monotonic()
    pause()  # no lookup: at once
    assert time.monotonic() - started < 0.05 and pause.waited == 0.0
    t, _ = _hold(0.4)
    started = time.monotonic()
    pause()
    took = time.monotonic() - started
    t.join(5)
    assert 0.25 < took < 5 and urgent_now() == 0  # waited for the lookup, not for the budget
    assert 0.25 < pause.waited < 5


def test_the_pauses_of_one_read_are_capped_so_lookups_never_stop_it() -> None:
    pause = Pause(budget=0.3)
    t, _ = _hold(3.0)
    started = time.monotonic()
    pause()
    assert 0.2 < time.monotonic() - started < 2.0
    again = time.monotonic()
    pause()  # the budget is spent: the read goes on while the lookup still runs
    assert time.monotonic() - again < 0.1 and urgent_now() == 1
    t.join(5)


def test_the_shard_readers_of_one_read_share_its_budget() -> None:
    """Four readers waiting at once spend the budget once (wall time), not four times over."""
    pause = Pause(budget=0.4)
    t, _ = _hold(3.0)
    started = time.monotonic()
    readers = [threading.Thread(target=pause) for _ in range(4)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(5)
    assert 0.3 < time.monotonic() - started < 2.0 and 0.3 < pause.waited < 2.0
    t.join(5)


def test_a_read_begun_in_an_urgent_block_never_waits() -> None:
    """A bulk action's fresh read of the whole index (or a lookup's own reads) must not wait for itself."""
    t, _ = _hold(2.0)
    with urgent():
        with urgent():  # nested: counted once
            assert urgent_now() == 2
        pause = Pause(budget=10.0)
    started = time.monotonic()
    pause()
    assert time.monotonic() - started < 0.1
    t.join(5)
    assert urgent_now() == 0
