"""The one way every time an operator types is read: :func:`parse_moment` (pure); and :func:`iso`, how one is written.

The rule, for every time option of every ``delayq`` command and for the web page's API:

* ISO 8601, with or without a time: ``2026-11-23``, ``2026-11-23T08:00``, ``2026-11-23 08:00:00+01:00``. **No
  offset means UTC**, as every time the CLI prints is UTC (``due (UTC)``, ``parked at ... UTC``); a local
  reading would make the same text mean different moments on different machines.
* Epoch seconds: ``1764000000``.
* A duration (``90s``, ``10m``, ``2h``, ``3d``, ``1w``) counted from now: forwards (``+``) or backwards (``-``);
  without a sign, the given ``direction`` (a due time looks ahead, a ``--since`` looks back).

The value is epoch seconds (a float). The CLI's click type (:class:`celery_delayq.options.Moment`) reads through
it.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Literal

__all__ = ["parse_moment", "iso", "FORMS", "Direction", "EARLIEST", "LATEST"]

_DURATION = re.compile(r"^([+-]?)\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)$", re.IGNORECASE)
_SECONDS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_EPOCH = re.compile(r"^\d{9,}(?:\.\d+)?$")
#: The accepted forms, as every error message and help text names them.
FORMS = "ISO 8601 (no offset = UTC), epoch seconds, or a duration such as 90s, 10m, 2h, 3d"

Direction = Literal["ahead", "ago"]
#: The calendar's range (years 1970 to 9999): a time outside it cannot be shown or compared as a date.
EARLIEST, LATEST = 0.0, 253402300799.0

def parse_moment(text: str, *, direction: Direction, now: float | None = None) -> float:
    """Epoch seconds of ``text`` (see the module docstring for the forms).

    Raises:
        ValueError: naming the accepted forms; or a time outside the years 1970-9999
            (``99999999999999999999`` is refused here, not as an ``OverflowError`` later).
    """
    value = text.strip()
    match = _DURATION.match(value)
    if match:
        sign, amount, unit = match.groups()
        ahead = sign == "+" or (not sign and direction == "ahead")
        seconds = float(amount) * _SECONDS[unit.lower()]
        found = (time.time() if now is None else now) + (seconds if ahead else -seconds)
    elif _EPOCH.match(value):
        found = float(value)
    else:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"{_quoted(text)} is not a time: give {FORMS}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        found = moment.timestamp()
    if not (EARLIEST <= found <= LATEST):  # NaN fails too
        raise ValueError(f"{_quoted(text)} is outside the years 1970-9999: give {FORMS}")
    return found


def _quoted(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "...'"


def iso(epoch: float) -> str:
    """ISO 8601 UTC with milliseconds, e.g. ``2026-11-23T08:00:00.000Z`` (how every time is written out)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
