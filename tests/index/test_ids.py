"""Task ids resolved against the index (:mod:`celery_delayq.index.ids`), on a real broker."""

from __future__ import annotations

import uuid

from celery_delayq import cancel
from celery_delayq.glue.app_ladder import index_of
from celery_delayq.index.cancel_book import CancelBook
from celery_delayq.index.ids import resolve_ids


def test_a_whole_uuid_is_looked_up_in_its_shard_only(make_app) -> None:
    """A miss on a Celery-style id costs one index shard, never a scan of every waiting task."""
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    waiting = later.apply_async(countdown=3600)
    scans: list[int] = []

    def book() -> CancelBook:  # read once an id is found, and when a prefix is matched against every waiting id
        scans.append(1)
        return CancelBook()

    connection, layout = index_of(app)
    missing = str(uuid.uuid4())
    resolved = resolve_ids(connection, layout, [missing], book=book)
    assert resolved.unknown == [missing] and resolved.found == {} and scans == []
    assert "the shards of 1 id(s)" in resolved.looked_at  # not "all N waiting task(s)"
    resolved = resolve_ids(connection, layout, [missing, waiting.id], book=book)
    assert resolved.unknown == [missing] and list(resolved.found) == [waiting.id] and scans == [1]
    assert list(resolve_ids(connection, layout, [waiting.id[:8]], book=book).found) == [waiting.id[:8]]
    assert scans == [1, 1]  # a start of an id is still resolved, by reading them all
    cancel(app, waiting.id)
