"""Every on-broker format carries its version, and a newer one is refused with a clear error (real broker, worker).

What a newer release might write is stood for by messages written here with a version above
:data:`~celery_delayq.ladder.formats.VERSIONS`: an index message, a cancel-log entry, a parked
message and a task's ladder headers. Readers that serve a person (``pending``, the cancel book,
the parking list) raise :class:`~celery_delayq.FormatTooNew`; a worker says it in its log and
goes on with what it can read (a follower stuck on one entry would miss every later cancel).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import amqp
import pytest

from celery_delayq import FormatTooNew, cancel, pending
from celery_delayq.glue.app_ladder import index_of
from celery_delayq.index.cancel_log import CANCEL, UNTIL, record
from celery_delayq.index.lookup import read_cancel_book
from celery_delayq.index.stream import StreamReader, reader_connection
from celery_delayq.ladder import headers as H
from celery_delayq.ladder.formats import PARKED_FORMAT, VERSIONS
from celery_delayq.ladder.index_layout import ENTRIES
from celery_delayq.parking import ParkingQueue
from helpers import Collector, running_worker
from retry_helpers import park_synthetic


def _stream_headers(app: Any, queue: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    connection, _layout = index_of(app)
    with reader_connection(connection) as raw:
        return [headers for _o, headers, _m in StreamReader(raw, queue).read("first", fields)]


def _own_ladder(uid: str) -> dict[str, Any]:
    """A small ladder of the test's own: what it writes in a newer format must not reach other tests' readers
    (make_app deletes it afterwards)."""
    return {"delayq_prefix": f"fmt{uid}", "delayq_levels": 8}


def test_what_this_release_writes_states_its_format(make_app, collector: Collector, uid: str) -> None:
    """The delivered task's headers, its index message and a cancel-log entry each carry their version."""
    app = make_app(delayq_enabled=True, **_own_ladder(uid))  # its cancel log holds only this test's cancel

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any) -> None:
        collector.add(format=self.request.get(H.FORMAT), id=self.request.id)

    with running_worker(app):
        kept = job.apply_async(countdown=0.5)
        doomed = job.apply_async(countdown=60)
        cancel(app, doomed.id)
        [ran] = collector.wait_for(1, timeout=20)
    assert (ran["format"], ran["id"]) == (VERSIONS["ladder"], kept.id)
    _connection, layout = index_of(app)
    index = [h for shard in layout.shard_queues
             for h in _stream_headers(app, shard, (ENTRIES, H.FORMAT)) if h.get(ENTRIES) is not None]
    assert index and all(h[H.FORMAT] == VERSIONS["index"] for h in index)
    cancels = [h for h in _stream_headers(app, layout.cancel_queue, (CANCEL, H.FORMAT)) if h.get(CANCEL)]
    assert [(h[CANCEL], h[H.FORMAT]) for h in cancels] == [(doomed.id, VERSIONS["cancel"])]


def test_a_newer_index_message_makes_pending_refuse_with_the_upgrade(make_app, amqp_conn: amqp.Connection,
                                                                    uid: str) -> None:
    app = make_app(delayq_enabled=True, **_own_ladder(uid))

    @app.task(name=f"{app.main}.job")
    def job() -> None: ...

    waiting = job.apply_async(countdown=120)
    assert [t.task_id for t in pending(app, task_id=waiting.id)] == [waiting.id]  # version 1 reads
    _connection, layout = index_of(app)
    newer = uuid.uuid4().hex
    entry = [newer, f"{app.main}.job", time.time() + 100, "", "q", "q", 0, uuid.uuid4().hex]
    amqp_conn.channel().basic_publish(
        amqp.Message(json.dumps([entry]).encode(), content_type="application/json", delivery_mode=2,
                     application_headers={ENTRIES: 1, H.FORMAT: VERSIONS["index"] + 1}),
        exchange="", routing_key=layout.shard_queue(layout.shard_of(newer)))
    with pytest.raises(FormatTooNew, match=r"index format 2.*upgrade"):
        pending(app)
    with pytest.raises(FormatTooNew):
        pending(app, task_id=newer)
    cancel(app, waiting.id, lookup=False, force=True)


def test_a_newer_cancel_entry_is_refused_by_readers_and_skipped_loudly_by_a_worker(
        make_app, collector: Collector, caplog: pytest.LogCaptureFixture, uid: str) -> None:
    app = make_app(delayq_enabled=True, **_own_ladder(uid))

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag)

    connection, layout = index_of(app)
    with reader_connection(connection) as raw:  # an entry a newer release wrote
        StreamReader(raw, layout.cancel_queue)  # the log exists once the ladder is declared
    doomed = job.apply_async(("doomed",), countdown=4)
    kept = job.apply_async(("kept",), countdown=4)
    with reader_connection(connection) as raw:
        from celery_delayq.index.stream import append
        assert not append(raw, layout.cancel_queue, [({CANCEL: uuid.uuid4().hex, UNTIL: time.time() + 600,
                                                      H.FORMAT: VERSIONS["cancel"] + 1}, None)], timeout=10)
    with pytest.raises(FormatTooNew, match="cancel format 2"):
        read_cancel_book(connection, layout)
    with caplog.at_level(logging.ERROR, logger="celery_delayq"), running_worker(app):
        with pytest.raises(FormatTooNew):  # ``cancel`` reads the log first, and refuses too
            cancel(app, doomed.id)
        with reader_connection(connection) as raw:  # written after the unreadable one, as this release does
            record(raw, layout, [(doomed.id, time.time() + 600, "cancelled")])
        collector.wait_for(1, timeout=20)
        time.sleep(0.5)
    assert [r["tag"] for r in collector.items] == ["kept"] and kept.id
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("cannot be read by this worker" in m and "cancel format 2" in m for m in errors), errors


def test_a_newer_parked_message_is_refused_by_the_parking_list(broker_url: str, amqp_conn: amqp.Connection,
                                                              uid: str) -> None:
    import kombu

    queue, dest = f"parking.{uid}", f"dest.{uid}"
    amqp_conn.channel().queue_declare(dest, durable=True, auto_delete=False)
    try:
        [parked_id] = park_synthetic(broker_url, queue, 1, exc=ValueError("v1"), dest=dest)
        with ParkingQueue(kombu.Connection(broker_url), queue) as parked:
            [found] = parked.list()
            assert found.parked_id == parked_id and found.headers[PARKED_FORMAT] == VERSIONS["parked"]
        amqp_conn.channel().basic_publish(
            amqp.Message(b"[[], {}, {}]", delivery_mode=2,
                         application_headers={PARKED_FORMAT: VERSIONS["parked"] + 1, "x-delayq-parked-id": "n"}),
            exchange="", routing_key=queue)
        with ParkingQueue(kombu.Connection(broker_url), queue) as parked:
            with pytest.raises(FormatTooNew, match="parked format 2"):
                parked.list()
            assert parked.count() == 2  # reading looked, took nothing
    finally:
        amqp_conn.channel().queue_delete(queue)
        amqp_conn.channel().queue_delete(dest)


def test_a_worker_runs_a_task_with_newer_ladder_headers_and_says_to_upgrade(
        make_app, collector: Collector, caplog: pytest.LogCaptureFixture, broker_url: str) -> None:
    import kombu

    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.job")
    def job(tag: str) -> None:
        collector.add(tag=tag)

    def publish_newer(tag: str) -> None:
        """As a newer release's ladder delivers it: straight into the queue (the app's own producer would
        drop ladder headers from an undelayed publish)."""
        message = app.amqp.create_task_message(uuid.uuid4().hex, job.name, (tag,), {})
        headers = {**message.headers, H.DUE: time.time(), H.ENTRY: uuid.uuid4().hex, H.FORMAT: VERSIONS["ladder"] + 1}
        with kombu.Connection(broker_url) as conn:
            kombu.Producer(conn).publish(message.body, routing_key=app.conf.task_default_queue, headers=headers,
                                         serializer="json", **message.properties)

    with caplog.at_level(logging.ERROR, logger="celery_delayq"), running_worker(app):
        publish_newer("newer")
        publish_newer("again")
        collector.wait_for(2, timeout=20)
    assert sorted(r["tag"] for r in collector.items) == ["again", "newer"]
    errors = [r.getMessage() for r in caplog.records if "ladder format 2" in r.getMessage()]
    assert len(errors) == 1 and "upgrade" in errors[0], errors  # once per version found, not per task
