"""Explicit delays: a task that knows when to come back says so (HTTP 429 ``Retry-After``).

``raise RetryAfter(30, exc=err)`` or ``raise RetryAfter.from_header(resp.headers["Retry-After"], exc=err)``
retries the task after that delay, used as given but capped by the task's
maximum delay (``delayq_max_delay``, else ``retry_backoff_max``). The task's
stop rule and ``max_retries`` still apply.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Union

from ..errors import InvalidDelay

__all__ = ["RetryAfter", "RetryAfterValue", "parse_retry_after"]


#: What a ``Retry-After`` may be given as: delay-seconds or an HTTP-date (``str`` or ``bytes``), a number of
#: seconds, a ``timedelta`` or a ``datetime``.
RetryAfterValue = Union[str, bytes, float, timedelta, datetime]


def parse_retry_after(value: object, *, now: float | None = None) -> float:
    """Seconds to wait for a ``Retry-After`` value (never negative).

    Accepts what RFC 9110 allows, delay-seconds (``"120"``) or an HTTP-date
    (``"Wed, 21 Oct 2015 07:28:00 GMT"``), as ``str`` or ``bytes``, and also
    numbers, ``timedelta`` and ``datetime`` (naive = UTC) for code that has
    already parsed it. A date in the past means "now".

    Raises:
        InvalidDelay: the value is neither; the message quotes it.
    """
    wall = time.time() if now is None else now
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, datetime):
        when = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return max(0.0, when.timestamp() - wall)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise InvalidDelay(f"a Retry-After delay must be a finite number of seconds, got {value!r}")
        return max(0.0, float(value))
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return float(int(text))
        try:
            return parse_retry_after(parsedate_to_datetime(text), now=wall)
        except (TypeError, ValueError, IndexError):
            pass  # not an HTTP-date either; reported below
    raise InvalidDelay(
        f"Retry-After value {value!r} is neither delay-seconds (e.g. '120') nor an HTTP-date "
        "(e.g. 'Wed, 21 Oct 2015 07:28:00 GMT'); pass the header's value or a number of seconds")


class RetryAfter(Exception):
    """Raise from a DelayedRetryTask to retry after ``delay`` seconds.

    Args:
        after: Seconds, a ``Retry-After`` header value, a ``timedelta`` or a ``datetime``.
        exc: The underlying error; it is what the task reports if it gives up.

    Attributes:
        delay: The delay in seconds, as given (the cap is applied when retrying).
        exc: The underlying error, or ``None``.
    """

    def __init__(self, after: RetryAfterValue, exc: BaseException | None = None) -> None:
        self.delay = parse_retry_after(after)
        self.exc = exc
        # args are (delay, exc) so the exception pickles and rebuilds (result backends).
        super().__init__(self.delay, exc)

    @classmethod
    def from_header(cls, value: str | bytes, exc: BaseException | None = None) -> "RetryAfter":
        """From an HTTP ``Retry-After`` header value (delay-seconds or HTTP-date)."""
        return cls(value, exc=exc)

    def __str__(self) -> str:
        cause = f": {self.exc!r}" if self.exc is not None else ""
        return f"retry after {self.delay:g} s{cause}"
