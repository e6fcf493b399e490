"""Durations and ladders in words a person reads at a glance ("31 days", "1.3 s").

Used by the CLI and by the worker's start-up log line, where a raw number of
seconds ("max 2684355 s") makes the reader do the arithmetic.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - only named: a caller passes the spec
    from .spec import LadderSpec

__all__ = ["human_duration", "describe_ladder"]

#: (seconds per unit, singular, plural), largest first. Months and years are
#: left out on purpose: their length varies, and "400 days" is exact.
_UNITS = (
    (86400.0, " day", " days"),
    (3600.0, " h", " h"),
    (60.0, " min", " min"),
    (1.0, " s", " s"),
    (0.001, " ms", " ms"),
)


def _figure(value: float) -> str:
    """Two significant figures below 10 ("1.3", "4"), whole numbers above ("31", "600")."""
    text = f"{value:.1f}" if value < 10 else f"{value:.0f}"
    return text[:-2] if text.endswith(".0") else text


def human_duration(seconds: float) -> str:
    """A short, rounded reading of a duration: ``"31 days"``, ``"2.5 h"``, ``"4 min"``, ``"1.3 s"``, ``"10 ms"``.

    The unit is the largest one the duration fills at least once; below 10 of
    that unit one decimal is kept, above it whole numbers. Negative durations
    (lateness ahead of time) keep their sign; NaN and infinities are spelled out.
    """
    if math.isnan(seconds):
        return "unknown"
    if math.isinf(seconds):
        return "forever" if seconds > 0 else "-forever"
    sign = "-" if seconds < 0 else ""
    magnitude = abs(float(seconds))
    if magnitude == 0:
        return "0 s"
    # The largest unit the duration fills at least once (the smallest unit for tiny ones).
    index = next((i for i, (size, _, _) in enumerate(_UNITS) if magnitude >= size), len(_UNITS) - 1)
    text = _figure(magnitude / _UNITS[index][0])
    # Rounding can reach the next unit up: 59.96 s reads "1 min", not "60 s".
    if index > 0 and float(text) * _UNITS[index][0] >= _UNITS[index - 1][0]:
        index -= 1
        text = _figure(magnitude / _UNITS[index][0])
    _, one, many = _UNITS[index]
    return f"{sign}{text}{one if text == '1' else many}"


def describe_ladder(spec: LadderSpec, queue_type: str | None = None) -> str:
    """One line about a ladder's shape, e.g. ``ladder 'delayq': radix 4, 14 levels, unit 10 ms, one pass 31 days (longer delays lap), quorum``.

    ``queue_type`` is appended when known (it is resolved against the broker).
    """
    parts: list[Any] = [
        f"radix {spec.radix}",
        f"{spec.levels} level{'' if spec.levels == 1 else 's'}",
        f"unit {human_duration(spec.unit_ms / 1000)}",
        f"one pass {human_duration(spec.max_delay_s)} (longer delays lap)",
    ]
    if spec.shards > 1:
        parts.insert(2, f"{spec.shards} shards")
    if queue_type:
        parts.append(queue_type)
    return f"ladder {spec.prefix!r}: " + ", ".join(parts)
