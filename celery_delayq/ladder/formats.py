"""Versions of the formats celery_delayq keeps on the broker, and the one rule every reader applies (pure).

Four formats outlive the process that wrote them: ``ladder`` (the ``x-delayq-*`` headers), ``index`` and
``cancel`` (stream entries) and ``parked`` (a parked message's failure headers, versioned by
:data:`PARKED_FORMAT` since it keeps its ladder headers too); the table: ``docs/stability.md``, "On-broker
formats". A version changes only when a reader of the previous one would misread it. A reader takes every
version up to its own and meets a newer one with :class:`~celery_delayq.errors.FormatTooNew`, never with a
guess; a missing header (0.1.0 wrote none) reads as 1.
"""

from __future__ import annotations

from typing import Any, Final, Literal, Mapping

from ..errors import FormatTooNew
from .headers import FORMAT, FORMAT_VERSION

__all__ = ["FORMAT", "PARKED_FORMAT", "VERSIONS", "FormatName", "version_of", "check_format"]

#: Header of the format version of a parked message's failure headers.
PARKED_FORMAT: Final = "x-delayq-parked-format"

FormatName = Literal["ladder", "index", "cancel", "parked"]

#: The version this release writes and the newest it reads, per format.
VERSIONS: Final[Mapping[FormatName, int]] = {"ladder": FORMAT_VERSION, "index": 1, "cancel": 1, "parked": 1}

_HEADER: Final[Mapping[FormatName, str]] = {"ladder": FORMAT, "index": FORMAT, "cancel": FORMAT,
                                            "parked": PARKED_FORMAT}
_WHAT: Final[Mapping[FormatName, str]] = {
    "ladder": "a delayed message", "index": "a message of the index of waiting tasks",
    "cancel": "a cancel-log entry", "parked": "a parked message",
}


def version_of(headers: Mapping[str, Any], name: FormatName) -> int | None:
    """The version ``headers`` state for format ``name``: 1 when absent (0.1.0), ``None`` when unreadable."""
    value = headers.get(_HEADER[name])
    if value is None:
        return 1
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def check_format(headers: Mapping[str, Any], name: FormatName) -> int:
    """The version of format ``name`` in ``headers``, when this release reads it.

    Raises:
        FormatTooNew: a newer version than this release reads, or a version header that is not a
            positive integer (only a newer release, or something that is not celery_delayq, writes one).
    """
    version = version_of(headers, name)
    supported = VERSIONS[name]
    if version is None or version > supported:
        raise FormatTooNew(name, _WHAT[name], headers.get(_HEADER[name]), supported)
    return version

