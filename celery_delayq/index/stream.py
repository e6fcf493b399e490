"""Read a RabbitMQ stream over AMQP 0-9-1 from a start point to its end, fast and without changing it.

The reader appends a confirmed marker (:data:`~celery_delayq.ladder.index_layout.MARKER`) and reads until it
meets it, taking the socket's frames itself once py-amqp set the consumer up (docs/how-it-works.md, "The index
of waiting tasks"). Every read and write of the index and the cancel log goes through :func:`reader_connection`
(which says when the broker has no streams) and, for a write, :func:`append`: with the writer, the index's only
``amqp`` I/O.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import uuid
from datetime import datetime
from typing import Any, Callable, Collection, Iterator, Sequence

import kombu

from ..rabbitmq.confirms import ConfirmChannel, Tracker, dedicated_copy
from ..rabbitmq.client import Channel, Connection, Message, attempts, broker_version
from ..errors import DelayqError, PublishError, TopologyMissing
from ..ladder.headers import ENTRY
from .frames import BASIC_DELIVER, HeaderReader, delivery_tag
from ..ladder.index_layout import ENTRIES, MARKER, STREAM_VERSION

__all__ = ["StreamReader", "StreamEntry", "StreamReadError", "IndexUnavailable", "OFFSET", "BODY",
           "reader_connection", "append"]

#: Header RabbitMQ adds to every message read from a stream: its offset.
OFFSET = "x-stream-offset"
#: Key under which the body of a compact index message (:mod:`.writer`) is handed out with its headers.
BODY = "body"

_FRAME_END = 0xCE
_RECV = 1 << 18
_unpack_from = struct.unpack_from


class StreamReadError(DelayqError):
    """A stream could not be read to its end (stalled, deleted, or the channel was closed)."""


class IndexUnavailable(TopologyMissing):
    """There is no index of waiting tasks to read (turned off, broker too old, or not declared yet)."""


#: ``(offset, headers, message_id)`` of one stream message (markers excluded).
StreamEntry = tuple[int, dict[str, Any], "str | None"]


class StreamReader:
    """Reads one stream queue from ``start`` up to a marker of its own.

    Args:
        connection: A connected py-amqp connection (heartbeats off: a long read does not service them).
        queue: The stream queue.
        prefetch: Deliveries in flight (stream consumers need a prefetch); 1,000 measured as fast as 500-4,000
            on both brokers here.
        stall_timeout: Seconds without any data before giving up.
        confirm_timeout: Seconds to wait for the marker's confirm.
    """

    def __init__(self, connection: Connection, queue: str, *, prefetch: int = 1000,
                 stall_timeout: float = 30.0, confirm_timeout: float = 30.0) -> None:
        self.connection = connection
        self.queue = queue
        self.prefetch = prefetch
        self.stall_timeout = stall_timeout
        self.confirm_timeout = confirm_timeout
        #: Offset of the marker this reader stopped at (after :meth:`read`).
        self.end_offset: int | None = None

    def write_marker(self) -> str:
        """Append a marker to the stream (confirmed); returns its token."""
        token = uuid.uuid4().hex
        if failures := append(self.connection, self.queue, [({MARKER: token, ENTRY: token}, None)],
                              timeout=self.confirm_timeout):
            raise StreamReadError(f"could not mark the end of stream {self.queue!r}: {failures[0]}")
        return token

    def read(self, start: int | str | datetime, fields: Collection[str], *,
             prefilter: re.Pattern[bytes] | None = None,
             pause: Callable[[], None] | None = None) -> Iterator[StreamEntry]:
        """Yield ``(offset, headers, message_id)`` of each message from ``start`` to the stream's end.

        ``start`` is an offset, ``"first"`` or a datetime (the first chunk written at or after it). Only
        ``fields`` of the headers are decoded; with ``prefilter``, only messages whose header frame matches it
        are. ``pause`` is called before each read of the socket (a bulk read's
        :class:`~celery_delayq.index.priority.Pause`: it may wait there).
        """
        token = self.write_marker()
        wanted = set(fields) | {MARKER, OFFSET, ENTRIES}
        headers_of = HeaderReader(wanted)
        early: list[Message] = []
        ch = self.connection.channel()
        consumer: str | None = None
        try:
            ch.basic_qos(0, self.prefetch, False)
            consumer = ch.basic_consume(self.queue, callback=early.append, no_ack=False,
                                        arguments={"x-stream-offset": start})
            for message in early:  # delivered while py-amqp still read (not expected)
                entry = _entry_of(message, wanted)
                if entry[1].get(MARKER) == token:
                    self.end_offset = entry[0]
                    return
                if entry[1].get(MARKER) is None:
                    yield entry
            yield from self._frames(ch, token, wanted, headers_of, prefilter, pause)
        finally:
            # Deliveries past the marker may be in flight: closed with its consumer active, the channel would log
            # "Received method (60, 60) during closing channel N" for each. Cancelled first, they are dropped.
            with contextlib.suppress(Exception):
                if ch.is_open:
                    if consumer is not None:
                        ch.basic_cancel(consumer)
                    early.clear()
                    ch.close()

    # -- the fast path ------------------------------------------------------------
    def _frames(self, ch: Channel, token: str, wanted: set[str], headers_of: HeaderReader,
                prefilter: re.Pattern[bytes] | None, pause: Callable[[], None] | None) -> Iterator[StreamEntry]:
        transport = self.connection.transport
        sock = getattr(transport, "sock", None)
        if sock is None or not hasattr(transport, "_read_buffer"):
            yield from self._slow(ch, token, wanted, pause)
            return
        token_b = token.encode()
        batch_key = b"%c%s" % (len(ENTRIES), ENTRIES.encode())  # the key as encoded in a header table
        body: bytearray | None = None  # the body of a compact index message being collected
        body_headers: dict[str, Any] = {}
        body_mid: str | None = None
        buf = bytearray(transport._read_buffer)
        transport._read_buffer = b""
        pos = 0
        #: Where the message being read began; equal to ``pos`` between messages. The
        #: unread bytes go back to py-amqp from here, so it resumes at a message boundary.
        msg_start = 0
        body_left = 0
        chan = ch.channel_id
        acked = last_tag = 0
        half = max(1, self.prefetch // 2)
        old_timeout = sock.gettimeout()
        sock.settimeout(self.stall_timeout)
        try:
            while True:
                while len(buf) - pos >= 8:
                    ftype, fchan, size = _unpack_from(">BHI", buf, pos)
                    end = pos + 7 + size
                    if len(buf) <= end:
                        break
                    if buf[end] != _FRAME_END:
                        raise StreamReadError(f"malformed AMQP frame while reading stream {self.queue!r}")
                    if fchan != chan or (ftype == 1 and buf[pos + 7:pos + 11] != BASIC_DELIVER):
                        # Anything but our deliveries (a channel or connection close, a
                        # cancel): py-amqp deals with it, and raises if it is an error.
                        _hand_back(transport, buf, msg_start)
                        buf, pos, msg_start = bytearray(), 0, 0
                        self.connection.drain_events(timeout=self.stall_timeout)
                        raise StreamReadError(f"the broker interrupted the read of stream {self.queue!r}")
                    frame = pos + 7
                    pos = end + 1
                    if ftype == 1:
                        msg_start = frame - 7
                        last_tag = delivery_tag(buf, frame)
                        continue
                    if ftype == 3:
                        body_left -= size
                    elif ftype == 2:
                        (body_left,) = _unpack_from(">Q", buf, frame + 4)
                    if body_left <= 0:  # the message ends here: nothing of it is handed back to py-amqp
                        msg_start = pos
                    if ftype == 3 and body is not None:
                        body += buf[frame:end]
                        if body_left <= 0:
                            complete, body = bytes(body), None
                            if prefilter is None or prefilter.search(complete):
                                yield int(body_headers.get(OFFSET) or 0), {**body_headers, BODY: complete}, body_mid
                    elif ftype == 2 and (prefilter is None or prefilter.search(buf, frame, end)
                                         or buf.find(token_b, frame, end) >= 0
                                         or buf.find(batch_key, frame, end) >= 0):
                        headers, message_id = headers_of.read(buf, frame)
                        marker = headers.get(MARKER)
                        if marker == token:
                            self.end_offset = headers.get(OFFSET)
                            return
                        if headers.get(ENTRIES) is not None and body_left > 0:
                            body, body_headers, body_mid = bytearray(), headers, message_id
                        elif marker is None and (prefilter is None or prefilter.search(buf, frame, end)):
                            yield int(headers.get(OFFSET) or 0), headers, message_id
                if last_tag - acked >= half:
                    ch.basic_ack(last_tag, multiple=True)
                    acked = last_tag
                if msg_start:
                    del buf[:msg_start]
                    pos -= msg_start
                    msg_start = 0
                if pause is not None:
                    pause()  # the broker waits too: nothing is read from it meanwhile
                try:
                    chunk = sock.recv(_RECV)
                except socket.timeout:
                    raise StreamReadError(
                        f"stream {self.queue!r} sent nothing for {self.stall_timeout:.0f} s before its end "
                        "was reached; is the broker overloaded?") from None
                if not chunk:
                    raise StreamReadError(f"the broker closed the connection while stream {self.queue!r} was read")
                buf += chunk
        finally:
            # Whatever ended the read (the marker, an early stop, an error): py-amqp gets the bytes read past
            # the last message boundary and resumes there; a message cut short is delivered to it again.
            _hand_back(transport, buf, msg_start)
            with contextlib.suppress(Exception):
                sock.settimeout(old_timeout)

    def _slow(self, ch: Channel, token: str, wanted: set[str],
              pause: Callable[[], None] | None = None) -> Iterator[StreamEntry]:
        """py-amqp's own reading, for transports whose socket is not reachable."""
        got: list[Message] = []
        ch.callbacks = {tag: got.append for tag in ch.callbacks}
        while True:
            if pause is not None:
                pause()
            self.connection.drain_events(timeout=self.stall_timeout)
            for message in got:
                offset, headers, message_id = _entry_of(message, wanted)
                if headers.get(MARKER) == token:
                    self.end_offset = offset
                    return
                if headers.get(MARKER) is None:
                    yield offset, headers, message_id
                ch.basic_ack(message.delivery_tag, multiple=True)
            got.clear()


def _entry_of(message: Message, wanted: Collection[str]) -> StreamEntry:
    headers = message.application_headers or {}
    picked = {k: v for k, v in headers.items() if k in wanted}
    if ENTRIES in picked:
        body = message.body
        picked[BODY] = body.encode() if isinstance(body, str) else bytes(body)
    return int(headers.get(OFFSET) or 0), picked, message.properties.get("message_id")


def append(raw: Connection, queue: str, entries: Sequence[tuple[dict[str, Any], str | None]], *,
           timeout: float) -> list[PublishError]:
    """Append ``(headers, message_id)`` entries (empty bodies) to the stream ``queue``, confirmed.

    Returns the failures (empty when the broker confirmed every entry).
    """
    confirm = ConfirmChannel(raw)
    try:
        tracker = Tracker()
        for headers, message_id in entries:
            message = Message(b"", delivery_mode=2, application_headers=headers,
                                   **({"message_id": message_id} if message_id is not None else {}))
            confirm.publish(message, "", queue, tracker)
        confirm.wait(tracker=tracker, timeout=timeout)
        return tracker.take_failures()
    finally:
        with contextlib.suppress(Exception):
            confirm.channel.close()


@contextlib.contextmanager
def reader_connection(connection: kombu.Connection, *, retries: int = 1) -> Iterator[Connection]:
    """A py-amqp connection of its own to ``connection``'s broker, without heartbeats (a long read cannot
    serve them) and without ``confirm_publish`` (:func:`~celery_delayq.rabbitmq.confirms.dedicated_copy`).

    ``retries``: further rounds of every failover host (0.5 s apart, growing to 5 s) after a failed one.

    Raises:
        IndexUnavailable: the broker has no streams (before RabbitMQ 3.9): no index, no cancel log.
    """
    conn = dedicated_copy(connection, "index reader").clone(heartbeat=0)
    try:
        conn.ensure_connection(max_retries=attempts(conn, retries) - 1, interval_start=0.5, interval_step=1.0,
                               interval_max=5.0)
        version = broker_version(conn.connection)
        if version < STREAM_VERSION:
            raise IndexUnavailable(f"RabbitMQ {'.'.join(map(str, version))} has no streams (3.9 and later do), "
                                   "so there is no index of waiting tasks and no durable cancel; upgrade the broker.")
        yield conn.connection
    finally:
        with contextlib.suppress(Exception):  # closing after a failed read must not hide its error
            conn.release()


def _hand_back(transport: Any, buf: bytearray, pos: int) -> None:
    """Give py-amqp the bytes read past the last message boundary (``pos``): it resumes reading there."""
    transport._read_buffer = bytes(buf[pos:]) + transport._read_buffer
