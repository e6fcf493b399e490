"""Failures grouped by exception class and message pattern: how the page shows retries and parked tasks. Pure.

A message's *pattern* is the message with every token holding a digit (``42``, ``10.0.0.5:5672``, a UUID) and
every quoted text replaced by ``*``, so ``card declined for amount 17`` and ``... amount 99`` are one group. A
filter on the message (:func:`message_matches`) takes a pattern as shown, or any text found in the message.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

__all__ = ["ErrorGroup", "message_pattern", "message_matches", "group_errors", "split_error"]

_VARIABLE = re.compile(r"""'[^']*'|"[^"]*"|[\w.:/+-]*\d[\w.:/+-]*""")
#: A group's pattern is cut here (a message can be a page long).
PATTERN_MAX = 120


def message_pattern(message: str) -> str:
    """``message`` with its variable parts (numbers, ids, quoted text) as ``*``, on one line."""
    return _VARIABLE.sub("*", " ".join(message.split()))[:PATTERN_MAX]


def message_matches(message: str, wanted: str) -> bool:
    """Whether ``message`` has the pattern ``wanted`` or contains it (case-insensitive)."""
    return message_pattern(message) == wanted or wanted.lower() in message.lower()


def split_error(last_error: str | None) -> tuple[str, str]:
    """A retry's last error (``Type: message``) as ``(type, message)``; ``("", "")`` when there is none."""
    kind, _, message = (last_error or "").partition(": ")
    return kind, message


@dataclass(frozen=True)
class ErrorGroup:
    """Failures of one exception class and message pattern (``pattern`` None: the class as a whole)."""

    exception: str
    pattern: str | None
    count: int


def group_errors(errors: Iterable[tuple[str, str]]) -> list[ErrorGroup]:
    """Per exception class (most first), its total then its message patterns (most first).

    ``errors``: ``(exception type, message)`` of each failure.
    """
    by_pattern: Counter[tuple[str, str]] = Counter()
    for (kind, message), n in Counter(errors).items():  # each distinct message is read once
        by_pattern[kind, message_pattern(message)] += n
    by_kind: Counter[str] = Counter()
    for (kind, _), n in by_pattern.items():
        by_kind[kind] += n
    out: list[ErrorGroup] = []
    for kind, total in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])):
        out.append(ErrorGroup(kind, None, total))
        out += [ErrorGroup(kind, pattern, n) for (k, pattern), n in
                sorted(by_pattern.items(), key=lambda kv: (-kv[1], kv[0][1])) if k == kind]
    return out
