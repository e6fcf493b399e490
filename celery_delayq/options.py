"""The click types of every value a command reads (``delayq``'s, and the report's own): times, due times,
delays and ids.

One rule per kind of value, the same as the web page's API (:mod:`celery_delayq.inputs`): :class:`Moment` (a
time that selects), :class:`DueTime` (a new due time, strictly in the future), :class:`Delay` (from now, never
negative), :class:`Id`. Anything else is a usage error (exit status 2) in one line naming the option, the value
and the accepted forms, which each type's ``help`` writes into ``--help`` (docs/operations.md, "Times").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import click

from .errors import DelayqError
from .inputs import DELAY_FORMS, DUE_FORMS, check_id, parse_delay, parse_due
from .ladder.moments import EARLIEST, FORMS, LATEST, Direction, parse_moment

__all__ = ["Moment", "DueTime", "Delay", "Id"]

if TYPE_CHECKING:  # click 8.2 made ParamType generic; 8.1 (still supported) cannot be subscripted
    _FloatType = click.ParamType[float]
    _TextType = click.ParamType[str]
else:
    _FloatType = _TextType = click.ParamType


def _app_limit(ctx: click.Context | None) -> Callable[[float], None] | None:
    """The app's own delay limit (``DelayqConfig.check_delay``), when the CLI has an app (``-A``)."""
    app = getattr(ctx.find_root().obj, "app", None) if ctx is not None else None
    if app is None:
        return None
    from .config import DelayqConfig

    return DelayqConfig.from_app(app).check_delay


def _message(exc: BaseException, what: str) -> str:
    """The error without its leading ``what:`` (click's message already names the option)."""
    text = str(exc)
    return text[len(what) + 2:] if text.startswith(f"{what}: ") else text


class Moment(_FloatType):
    """A click type for every time option that selects (value: epoch seconds).

    ``direction`` is where a duration without a sign points: ``"ahead"`` (``pending --due-before 10m``: ten
    minutes from now) or ``"ago"`` (``report --since 6h``: six hours ago).
    """

    name = "when"

    def __init__(self, direction: Direction) -> None:
        self.direction: Direction = direction

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # a default given as a number
            if not (math.isfinite(value) and EARLIEST <= value <= LATEST):
                self.fail(f"{value!r} is outside the years 1970-9999: give {FORMS}", param, ctx)
            return float(value)
        try:
            return parse_moment(str(value), direction=self.direction)
        except (ValueError, OverflowError) as exc:  # parse_moment names the forms (and the range)
            self.fail(str(exc), param, ctx)

    def help(self, what: str) -> str:
        """``what``, then the rule: e.g. ``help("Only tasks due before")``."""
        way = "from now" if self.direction == "ahead" else "ago"
        return (f"{what} WHEN: ISO 8601 (UTC unless it has an offset), epoch seconds, "
                f"or a duration {way} (10m, 2h, 3d).")


class _AppLimited(_FloatType):
    """A value read with the app's delay limit (``check_delay``): :class:`DueTime`, :class:`Delay`.

    A refused value is one line naming it (``BadInput``, ``DelayTooLong``, a ``ValueError``), never a traceback.
    """

    #: How ``--help`` writes the value, and its accepted forms.
    metavar: ClassVar[str]
    forms: ClassVar[str]

    def _parse(self, value: object, ctx: click.Context | None) -> float:
        """The value, read with ``_app_limit(ctx)`` (raises ``ValueError`` or a ``DelayqError``)."""
        raise NotImplementedError

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return self._parse(value, ctx)
        except (ValueError, DelayqError) as exc:  # BadInput, DelayTooLong: one line naming the value
            self.fail(_message(exc, self.name), param, ctx)

    @classmethod
    def help(cls, what: str) -> str:
        """``what``, then the accepted forms."""
        return f"{what} {cls.metavar}: {cls.forms}."


class DueTime(_AppLimited):
    """A task's new due time (value: epoch seconds): in the future, within the app's longest delay.

    Read by :func:`~celery_delayq.inputs.parse_due` with the app's ``check_delay``, so ``-5m``, a past ISO time
    and ``""`` are refused (naming ``run-now``), never run the task now, and ``99999999999999999999`` is a usage
    error, not an ``OverflowError``.
    """

    name = "due"
    metavar = "WHEN"
    forms = DUE_FORMS

    def _parse(self, value: object, ctx: click.Context | None) -> float:
        if isinstance(value, float):  # already converted (click converts a default once more)
            return value
        return parse_due(str(value), what="due", check_delay=_app_limit(ctx))


class Delay(_AppLimited):
    """A delay from now in seconds (``90s``, ``10m``, or seconds), 0 or more, within the app's longest delay."""

    name = "delay"
    metavar = "DELAY"
    forms = DELAY_FORMS

    def _parse(self, value: object, ctx: click.Context | None) -> float:
        return parse_delay(value if isinstance(value, (int, float)) else str(value), what="delay",
                           check_delay=_app_limit(ctx))


class Id(_TextType):
    """A task or parked-message id, or the start of one: non-empty, printable, valid UTF-8, at most 255 characters."""

    name = "id"

    def __init__(self, what: str = "id") -> None:
        self.what = what  # how a message names the value when it is not shown by click (in the library's errors)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_id(value, what=self.what)
        except ValueError as exc:
            self.fail(_message(exc, self.what), param, ctx)
