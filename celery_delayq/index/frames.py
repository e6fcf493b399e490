"""Take just the fields the index needs out of raw AMQP 0-9-1 content-header frames (pure).

py-amqp decodes every property and header of every message (94-144 us per Celery task message here, slower than
the broker delivers a stream). This walks the header table once, decodes only the keys asked for and skips the
rest by their encoded size: a few microseconds per message. The encoding is AMQP 0-9-1's field table as RabbitMQ
writes it (the type letters of its errata, which py-amqp uses too).
"""

from __future__ import annotations

import struct
from typing import Any, Collection

__all__ = ["HeaderReader", "delivery_tag", "BASIC_DELIVER"]

#: Class and method id of ``basic.deliver`` at the start of a method frame's payload.
BASIC_DELIVER = b"\x00\x3c\x00\x3c"

_unpack_from = struct.unpack_from
_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4, ord("i"): 4,
          ord("f"): 4, ord("l"): 8, ord("L"): 8, ord("d"): 8, ord("T"): 8, ord("D"): 5, ord("V"): 0}
_SIZED = frozenset(ord(c) for c in "SxAF")
_SCALARS = {ord("b"): ">b", ord("B"): ">B", ord("s"): ">h", ord("u"): ">H", ord("I"): ">i", ord("i"): ">I",
            ord("f"): ">f", ord("l"): ">q", ord("L"): ">q", ord("d"): ">d", ord("T"): ">Q"}


def delivery_tag(payload: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """The delivery tag of a ``basic.deliver`` method frame payload starting at ``offset``."""
    tag_len = payload[offset + 4]  # consumer tag (shortstr) follows class and method ids
    (tag,) = _unpack_from(">Q", payload, offset + 5 + tag_len)
    return int(tag)


class HeaderReader:
    """Reads ``(headers, message_id)`` from content-header frame payloads, headers limited to ``wanted``.

    Values of the wanted keys are decoded when they are scalars (strings,
    numbers, booleans, ``None``); tables, arrays and decimals come back as ``None``.
    """

    def __init__(self, wanted: Collection[str]) -> None:
        self.wanted = {key.encode("utf-8"): key for key in wanted}
        self._lengths = frozenset(len(key) for key in self.wanted)

    def read(self, payload: bytes | bytearray | memoryview, offset: int = 0) -> tuple[dict[str, Any], str | None]:
        """Parse one ``basic`` content-header frame payload starting at ``offset``."""
        (flags,) = _unpack_from(">H", payload, offset + 12)
        pos = offset + 14
        more = flags
        while more & 1:  # further property-flag words (none are defined for basic)
            (more,) = _unpack_from(">H", payload, pos)
            pos += 2
        headers: dict[str, Any] = {}
        message_id: str | None = None
        if flags & 0x8000:  # content-type
            pos += 1 + payload[pos]
        if flags & 0x4000:  # content-encoding
            pos += 1 + payload[pos]
        if flags & 0x2000:  # headers
            (size,) = _unpack_from(">I", payload, pos)
            pos += 4
            headers = self._table(payload, pos, pos + size)
            pos += size
        if flags & 0x0080:  # message-id, after delivery-mode .. expiration
            if flags & 0x1000:
                pos += 1  # delivery-mode
            if flags & 0x0800:
                pos += 1  # priority
            for bit in (0x0400, 0x0200, 0x0100):  # correlation-id, reply-to, expiration
                if flags & bit:
                    pos += 1 + payload[pos]
            n = payload[pos]
            message_id = bytes(payload[pos + 1:pos + 1 + n]).decode("utf-8", "replace")
        return headers, message_id

    def _table(self, payload: Any, pos: int, end: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        wanted, lengths, fixed, sized = self.wanted, self._lengths, _FIXED, _SIZED
        while pos < end:
            klen = payload[pos]
            if klen in lengths:  # most keys are skipped without being copied
                name = wanted.get(bytes(payload[pos + 1:pos + 1 + klen]))
                if name is not None:
                    out[name] = _value(payload, pos + 2 + klen, payload[pos + 1 + klen])
            pos += 1 + klen
            kind = payload[pos]
            pos += 1
            width = fixed.get(kind)
            if width is not None:
                pos += width
            elif kind in sized:
                pos += 4 + _unpack_from(">I", payload, pos)[0]
            else:
                raise ValueError(f"unknown AMQP field type {chr(kind)!r} in a message header table")
        return out


def _value(payload: Any, pos: int, kind: int) -> Any:
    if kind == 83:  # 'S'
        (n,) = _unpack_from(">I", payload, pos)
        return bytes(payload[pos + 4:pos + 4 + n]).decode("utf-8", "replace")
    if kind == 116:  # 't'
        return bool(payload[pos])
    fmt = _SCALARS.get(kind)
    if fmt is not None:
        return _unpack_from(fmt, payload, pos)[0]
    if kind == 120:  # 'x'
        (n,) = _unpack_from(">I", payload, pos)
        return bytes(payload[pos + 4:pos + 4 + n])
    return None  # 'V' (None), tables, arrays, decimals
