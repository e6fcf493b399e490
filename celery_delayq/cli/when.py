"""The one way every ``delayq`` command reads a time: :class:`Moment`.

``pending --due-before``, ``parking --since`` and ``report --since`` used to
read the same text three ways (UTC, local time, UTC again, and durations in
one direction or the other). The rule now, for every time option:

* ISO 8601, with or without a time: ``2026-11-23``, ``2026-11-23T08:00``,
  ``2026-11-23 08:00:00+01:00``. **No offset means UTC**, as every time the
  CLI prints is UTC (``due (UTC)``, ``parked at ... UTC``); a local reading
  would make the same text mean different moments on different machines.
* Epoch seconds: ``1764000000``.
* A duration (``90s``, ``10m``, ``2h``, ``3d``, ``1w``) counted from now:
  forwards (``+``) or backwards (``-``); without a sign, the direction the
  option names (a due time looks ahead, a ``--since`` looks back), and that
  direction is written in the option's ``--help``.

The value is epoch seconds (a float). The help text of each option comes
from :meth:`Moment.help`, so the rule is stated the same way everywhere.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Literal

import click

__all__ = ["Moment", "parse_moment", "FORMS"]

_DURATION = re.compile(r"^([+-]?)\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)$", re.IGNORECASE)
_SECONDS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_EPOCH = re.compile(r"^\d{9,}(?:\.\d+)?$")
#: The accepted forms, as every error message and help text names them.
FORMS = "ISO 8601 (no offset = UTC), epoch seconds, or a duration such as 90s, 10m, 2h, 3d"

Direction = Literal["ahead", "ago"]

if TYPE_CHECKING:  # click 8.2 made ParamType generic; 8.1 (still supported) cannot be subscripted
    _ParamType = click.ParamType[float]
else:
    _ParamType = click.ParamType


def parse_moment(text: str, *, direction: Direction, now: float | None = None) -> float:
    """Epoch seconds of ``text`` (see the module docstring for the forms).

    Raises:
        ValueError: naming the accepted forms.
    """
    value = text.strip()
    match = _DURATION.match(value)
    if match:
        sign, amount, unit = match.groups()
        ahead = sign == "+" or (not sign and direction == "ahead")
        seconds = float(amount) * _SECONDS[unit.lower()]
        return (time.time() if now is None else now) + (seconds if ahead else -seconds)
    if _EPOCH.match(value):
        return float(value)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give {FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


class Moment(_ParamType):
    """A click type for every time option of every ``delayq`` command (value: epoch seconds).

    ``direction`` is where a duration without a sign points: ``"ahead"``
    (``pending --due-before 10m``: ten minutes from now) or ``"ago"``
    (``report --since 6h``: six hours ago).
    """

    name = "when"

    def __init__(self, direction: Direction) -> None:
        self.direction: Direction = direction

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return parse_moment(str(value), direction=self.direction)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

    def help(self, what: str) -> str:
        """``what``, then the rule: e.g. ``help("Only tasks due before WHEN.")``."""
        way = "from now" if self.direction == "ahead" else "ago"
        return (f"{what} WHEN: ISO 8601 (UTC unless it has an offset), epoch seconds, "
                f"or a duration {way} (10m, 2h, 3d).")
