"""Turn Celery's ``countdown``/``eta`` (and kombu-level delays) into a due time. Pure.

Celery semantics are kept on purpose: a zero or negative countdown, or an eta in the past, means "run now".
Anything that is not a point in time (NaN, infinity, a string that is not ISO 8601) is an error, raised before
anything is published, so bad input never loses a message.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidDelay

__all__ = ["due_from", "parse_eta", "check_countdown", "OLDEST_COUNTDOWN_S"]


def parse_eta(eta: Any) -> float:
    """Epoch seconds of an eta given as datetime, ISO-8601 string or epoch number.

    A naive datetime is taken as UTC, as Celery does with ``enable_utc``.
    """
    if isinstance(eta, datetime):
        when = eta if eta.tzinfo is not None else eta.replace(tzinfo=timezone.utc)
        return when.timestamp()
    if isinstance(eta, str):
        try:
            return parse_eta(datetime.fromisoformat(eta))
        except ValueError:
            raise InvalidDelay(f"eta {eta!r} is not an ISO-8601 date and time") from None
    if isinstance(eta, (int, float)) and not isinstance(eta, bool):
        if math.isnan(eta) or math.isinf(eta):
            raise InvalidDelay(f"eta must be finite, got {eta!r}")
        return float(eta)
    raise InvalidDelay(f"eta must be a datetime, an ISO-8601 string or epoch seconds, got {eta!r}")


#: The most negative countdown accepted (100 years ago). A negative countdown means
#: "run now", as in Celery; one beyond this is a bug upstream, and Celery itself fails on
#: it with an OverflowError or "countdown is out of range" depending on its size.
OLDEST_COUNTDOWN_S = -100 * 365.25 * 86400


def check_countdown(countdown: Any) -> float:
    """A countdown as seconds; ``InvalidDelay`` for anything that is not a usable number of seconds."""
    if isinstance(countdown, bool) or not isinstance(countdown, (int, float)):
        raise InvalidDelay(f"countdown must be a number of seconds, got {countdown!r}")
    if math.isnan(countdown) or math.isinf(countdown):
        raise InvalidDelay(f"countdown must be a finite number of seconds, got {countdown!r}")
    if countdown < OLDEST_COUNTDOWN_S:
        raise InvalidDelay(f"countdown {countdown!r} is more than 100 years in the past; "
                           "pass 0 (or no countdown) to run the task now")
    return float(countdown)



def due_from(countdown: Any = None, eta: Any = None, *, now: float) -> float | None:
    """The epoch time a message is due, or ``None`` when it should run now.

    ``eta`` wins over ``countdown`` when both are given, as in Celery.
    """
    if eta is not None:
        due = parse_eta(eta)
    elif countdown is not None:
        due = now + check_countdown(countdown)
    else:
        return None
    return due if due > now else None
