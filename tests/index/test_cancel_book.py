"""The cancels a process knows (:class:`celery_delayq.index.cancel_book.CancelBook`): expiry, pruning, renewals (pure)."""

from __future__ import annotations

import time

from celery_delayq.index.cancel_book import CancelBook


def test_book_holds_each_cancel_until_it_expires() -> None:
    book = CancelBook()
    book.add("a", 100.0)
    book.add("a", 50.0)  # an earlier expiry does not shorten a later one
    book.add("b", 10.0)
    assert book.cancelled("a", now=99.0) and not book.cancelled("a", now=100.0)
    assert not book.cancelled("b", now=10.0) and not book.cancelled("c", now=0.0)
    assert book.live(now=20.0) == {"a"}
    book.PRUNE_EVERY = 1
    book.add("c", time.time() + 60)  # pruning drops what expired, keeps the rest
    assert "b" not in book._until and "a" not in book._until and book.cancelled("c")


def test_book_renews_a_cancel_that_outlives_its_entry() -> None:
    keep, day, t0 = 32 * 86400.0, 86400.0, 1.8e9
    book = CancelBook()
    book.add("long", until=t0 + 41 * day, written=t0, due=t0 + 40 * day)
    book.add("short", until=t0 + 20 * day, written=t0)  # its entry outlives it: never renewed
    book.add("old", until=t0 + 60 * day)  # an entry without a write time (an older version): renewed at once
    assert book.renewals(keep, now=t0 + 10) == [("old", t0 + 60 * day)]
    assert book.renewals(keep, now=t0 + 16 * day) == [("long", t0 + 41 * day), ("old", t0 + 60 * day)]
    book.add("long", until=t0 + 41 * day, written=t0 + 16 * day)  # renewed: the newer entry counts
    assert [r for r in book.renewals(keep, now=t0 + 40 * day) if r[0] == "long"] == []  # lasts to day 48
    assert book.still_due(now=t0 + 39 * day) == {"long"} and book.still_due(now=t0 + 40 * day) == set()
