"""The one input model of every operator action: the API, the page's forms and the CLI (pure).

Every value that changes production state is read here, by the same rules whoever typed it: a new due time
(:func:`parse_due`, strictly in the future), a delay (:func:`parse_delay`), an id (:func:`check_id`) and a bulk
selection (:func:`require_selection`: a filter or an explicit ``all``, and to act the count a dry run returned).
Each refusal is a :class:`BadInput` (a ``ValueError``) naming the field, the value and what to give instead;
nothing is changed. The rules, and their HTTP statuses: docs/web.md, "Input rules".
"""

from __future__ import annotations

import math
import time
import unicodedata
from typing import Callable

from .errors import DelayqError, DelayTooLong
from .ladder.moments import FORMS, LATEST, parse_moment

__all__ = ["BadInput", "ID_MAX", "DUE_FORMS", "DELAY_FORMS", "parse_due", "parse_delay", "check_id",
           "require_selection", "describe_guard", "check_selection", "SelectionChanged", "MESSAGE"]

#: What a ``message`` filter matches (the web's lists and bulk actions).
MESSAGE = "The exception's message: a pattern as the groups show it, or text in it."
#: The longest id accepted (Celery's ids are 36-character UUIDs; RabbitMQ's short strings stop at 255).
ID_MAX = 255
#: How a due time may be written, as help texts and errors say it.
DUE_FORMS = f"{FORMS}; it must be in the future (to run a task now, use run-now)"
#: How a delay may be written.
DELAY_FORMS = "a duration from now: 90s, 10m, 2h, 3d, 1w, or seconds (0 or more)"


class BadInput(DelayqError, ValueError):
    """Operator input that means nothing, or would do what nobody asked; nothing was changed."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "...'"


def parse_due(value: str | float | int | None, *, what: str = "due", now: float | None = None,
              check_delay: Callable[[float], None] | None = None) -> float:
    """Epoch seconds of a new due time, strictly in the future.

    ``value``: text in any form of :data:`~celery_delayq.ladder.moments.FORMS` (a duration counts from now) or
    epoch seconds as a number. ``check_delay``: the app's own limit (``DelayqConfig.check_delay``), which raises
    :class:`~celery_delayq.errors.DelayTooLong`.

    Raises:
        BadInput: empty, not a time, in the past or now (names ``run-now``).
        DelayTooLong: later than the app accepts.
    """
    now = time.time() if now is None else now
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        raise BadInput(f"{what}: empty; give {DUE_FORMS}")
    if isinstance(value, (int, float)):
        due = float(value)
    else:
        try:
            due = parse_moment(str(value), direction="ahead", now=now)
        except (ValueError, OverflowError, OSError) as exc:
            raise BadInput(f"{what}: {exc}") from None
    if not math.isfinite(due):
        raise BadInput(f"{what}: {_show(value)} is not a time; give {DUE_FORMS}")
    if due > LATEST:
        raise BadInput(f"{what}: {_show(value)} is after the year 9999; give {DUE_FORMS}")
    if due <= now:
        if isinstance(value, (int, float)):  # epoch seconds: say which moment that is
            value = f"{_iso(due)} ({value:.0f})"
        raise BadInput(f"{what}: {_show(value)} is in the past (or now); a due time must be in the future. "
                       "To run the task now, use run-now")
    if check_delay is not None:
        check_delay(due - now)
    return due


def _iso(epoch: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(max(epoch, 0.0), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_delay(value: str | float | int | None, *, what: str = "delay",
                check_delay: Callable[[float], None] | None = None) -> float:
    """Seconds of a delay from now (``0`` is allowed: now), from ``90s``/``10m``/... or a number of seconds.

    Raises:
        BadInput: empty, negative, or not a duration.
        DelayTooLong: longer than the app accepts.
    """
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        raise BadInput(f"{what}: empty; give {DELAY_FORMS}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            if text.startswith(("+", "-")):
                raise BadInput(f"{what}: {_show(value)} has a sign; give {DELAY_FORMS}") from None
            try:
                seconds = parse_moment(text, direction="ahead", now=0.0)
            except (ValueError, OverflowError, OSError):
                raise BadInput(f"{what}: {_show(value)} is not a duration; give {DELAY_FORMS}") from None
            # a duration, not a calendar time or epoch (parse_moment reads those too)
            if abs(seconds) > 1e15 or not (text[-1:].isalpha() and text[:1].isdigit()):
                raise BadInput(f"{what}: {_show(value)} is not a duration; give {DELAY_FORMS}")
    if not math.isfinite(seconds) or seconds < 0:
        raise BadInput(f"{what}: {_show(value)} is not a delay of 0 seconds or more; give {DELAY_FORMS}")
    if check_delay is not None:
        check_delay(seconds)
    return seconds


def check_id(value: object, *, what: str = "id") -> str:
    """``value`` as an id, or :class:`BadInput` (empty, too long, a control character, not valid text)."""
    if not isinstance(value, str):
        raise BadInput(f"{what}: {_show(value)} is not text")
    text = value.strip()
    if not text:
        raise BadInput(f"{what}: empty")
    if len(text) > ID_MAX:
        raise BadInput(f"{what}: {len(text)} characters; an id has at most {ID_MAX}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"{what}: {_show(value)} is not valid text (UTF-8)") from None
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in text):
        raise BadInput(f"{what}: {_show(value)} has a control or unprintable character")
    return text


def require_selection(*, described: str, everything: bool, dry_run: bool, expect: int | None,
                      noun: str = "waiting task") -> None:
    """Refuse a bulk action whose selection is empty or unconfirmed.

    ``described``: the filter in words (``""`` when none was given). ``everything``:
    the operator asked for every {noun} explicitly (``all: true``, ``--all``). A dry
    run needs only the selection; acting needs ``expect`` too.

    Raises:
        BadInput: no filter and no ``all``; a filter *and* ``all``; acting without ``expect``;
            a negative ``expect``.
    """
    if not described and not everything:
        raise BadInput(f"no filter: give at least one filter, or select every {noun} explicitly "
                       "(all: true in the API, --all on the command line); an empty filter never means everything")
    if described and everything:
        raise BadInput(f"all (--all) selects every {noun}; it cannot be combined with a filter ({described})")
    if expect is not None and (isinstance(expect, bool) or expect < 0):
        raise BadInput(f"expect: {expect!r} is not a count")
    if not dry_run and expect is None:
        raise BadInput("expect: give the count a dry run returned, to confirm what is acted on")


def describe_guard(expect: int, matched: int, noun: str) -> str:
    """The refusal when the selection changed between the dry run and the action."""
    return (f"the selection now matches {matched} {noun}(s), not the {expect} confirmed; "
            "count again (dry run) and confirm that number; nothing was changed")


class SelectionChanged(DelayqError):
    """A bulk action's filter matches another count than the operator confirmed: nothing was done (409)."""

    def __init__(self, message: str, *, expect: int = 0, matched: int = 0) -> None:
        super().__init__(message)
        self.expect, self.matched = expect, matched


def check_selection(expect: int | None, matched: int, noun: str) -> None:
    """Refuse to act when the count confirmed (``require_selection`` made sure there is one) is not the count now.

    Raises:
        SelectionChanged: with :func:`describe_guard`'s words.
    """
    if expect != matched:
        confirmed = expect if expect is not None else 0
        raise SelectionChanged(describe_guard(confirmed, matched, noun), expect=confirmed, matched=matched)
