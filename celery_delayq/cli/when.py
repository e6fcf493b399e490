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

The value is epoch seconds (a float), read by
:func:`celery_delayq.ladder.moments.parse_moment` (the web page's API reads
times the same way). The help text of each option comes from
:meth:`Moment.help`, so the rule is stated the same way everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..ladder.moments import Direction, parse_moment

__all__ = ["Moment"]

if TYPE_CHECKING:  # click 8.2 made ParamType generic; 8.1 (still supported) cannot be subscripted
    _ParamType = click.ParamType[float]
else:
    _ParamType = click.ParamType


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
