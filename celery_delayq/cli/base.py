"""What every ``delayq`` sub-command shares: the app, its broker, short errors, confirmation, audit lines.

:class:`DelayqGroup` turns every failure into one line on stderr and a non-zero exit status (never a
traceback); :func:`confirm`, :func:`check_bulk` and :func:`confirm_bulk` are the one confirmation rule of
destructive and bulk commands; :class:`Action` and :func:`audit_action` write the audit lines. The exit
statuses, the bulk rule and the audit line are described in docs/operations.md ("Wrong input changes nothing").
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import sys
from typing import Any, Callable, Iterable, Iterator

import click
from rich.console import Console

from ..audit import LOGGER as AUDIT_LOGGER
from ..audit import audit, cli_actor
from ..errors import DelayqError
from ..glue.app_ladder import AppLadder, ladder_for
from ..inputs import BadInput, describe_guard, require_selection
from ..rabbitmq import client
from ..rabbitmq.client import CONNECTION_ERRORS, AMQPError

__all__ = ["DelayqGroup", "Action", "app_context", "app_name", "audit_action", "bulk_options", "check_bulk",
           "confirm", "confirm_bulk", "console", "named", "yes_option", "DEBUG_ENV"]

#: Set to 1 to see the traceback of an unexpected error instead of its one line.
DEBUG_ENV = "DELAYQ_DEBUG"


def app_context(ctx: click.Context) -> AppLadder:
    """The :class:`AppLadder` of this CLI run (from Celery's ``-A``), without installing it,
    with the app's settings as they are now (a command reads them afresh)."""
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run as `celery -A YOUR_APP delayq ...`")
    ladder = ladder_for(app)
    ladder.reread()
    return ladder


def app_name(ctx: click.Context | None) -> str:
    """How the operator names the app: the ``-A`` value given to ``celery``, else the app's ``main``, else ``APP``.

    The ``-A`` text is what they typed, so a hint that repeats it can be pasted back as it is; an app's ``main``
    (``Celery("shop")``) is a fair guess without ``-A`` (tests, embedding); ``__main__`` is not a name.
    """
    if ctx is None:
        return "APP"
    given = ctx.find_root().params.get("app")
    if isinstance(given, str) and given.strip():
        return given.strip()
    main = getattr(getattr(ctx.obj, "app", None), "main", None)
    if isinstance(main, str) and main and main != "__main__":
        return main
    return "APP"


def named(ctx: click.Context | None, text: str) -> str:
    """``text`` with every ``celery -A APP`` hint naming the app as the operator does (:func:`app_name`)."""
    return text.replace("celery -A APP ", f"celery -A {app_name(ctx)} ")


def _cause(exc: BaseException) -> str:
    """The useful part of an error: the AMQP reply text, or the OS error without its errno."""
    text = getattr(exc, "reply_text", None) or str(exc) or type(exc).__name__
    return re.sub(r"^\[Errno -?\d+\]\s*", "", str(text)).strip()


class DelayqGroup(click.Group):
    """The ``delayq`` group: runs a sub-command and turns every failure into one line (docs/operations.md)."""

    def invoke(self, ctx: click.Context) -> Any:
        with _audit_shown():
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:
                raise _one_line(exc) from None
            except click.ClickException as exc:
                if type(exc) is click.ClickException and "celery -A APP " in exc.message:
                    raise click.ClickException(named(ctx, exc.message)) from None
                raise
            except (click.exceptions.Exit, click.Abort):
                raise
            except DelayqError as exc:  # BadInput, DelayTooLong, TaskNotWaiting, WeakSecret, ...
                raise click.ClickException(named(ctx, str(exc))) from None
            except OSError as exc:
                if getattr(exc, "filename", None):  # a file (report --out, export): not the broker
                    raise click.ClickException(f"{exc.filename}: {_cause(exc)}") from None
                raise click.ClickException(_unreachable(ctx, exc)) from None
            except CONNECTION_ERRORS as exc:
                raise click.ClickException(_unreachable(ctx, exc)) from None
            except AMQPError as exc:
                # Login and permission refusals are channel errors in py-amqp (403 ACCESS_REFUSED).
                raise click.ClickException(f"RabbitMQ at {_uri(ctx)} refused: {_cause(exc)}") from None
            except UnicodeError as exc:  # a surrogate-escaped argument ($'\xff') reached text that must be UTF-8
                raise click.ClickException(
                    f"{_first_line(exc)}: an argument is not valid text (UTF-8); type it again") from None
            except Exception as exc:  # a bad value, or the last resort (a bug): one line; the traceback on request
                if os.environ.get(DEBUG_ENV):
                    raise
                if isinstance(exc, (ValueError, OverflowError)):
                    raise click.ClickException(f"invalid value: {_first_line(exc)} ({type(exc).__name__}; "
                                               f"{DEBUG_ENV}=1 shows the traceback)") from None
                raise click.ClickException(f"unexpected {type(exc).__name__}: {_first_line(exc)} (a bug: run "
                                           f"again with {DEBUG_ENV}=1 to see the traceback, and report it)") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _one_line(exc: click.UsageError) -> click.UsageError:
    """The usage error on one line: the message, then where the help is (click would print usage and a hint)."""
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return click.UsageError(" ".join(exc.format_message().split()) + where, ctx=None)  # exit status 2


def _unreachable(ctx: click.Context, exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) or isinstance(exc.__cause__, TimeoutError):  # kombu wraps it
        # the host took the connection (or drops it) but no broker answered in time
        return (f"RabbitMQ at {_uri(ctx)} did not answer within {client.READ_SIDE_CONNECT_TIMEOUT_S:g} s (or "
                "broker_connection_timeout, if longer): it is overloaded (see `rabbitmqctl status`, memory and "
                "disk alarms), or a firewall drops the connection.")
    return (f"cannot reach RabbitMQ at {_uri(ctx)}: {_cause(exc)}. Check that the broker runs "
            "and that broker_url (or delayq_broker_url) points at it.")


#: True while a refusal's audit line is logged: the operator reads the refusal as the error line itself.
_REFUSING: contextvars.ContextVar[bool] = contextvars.ContextVar("delayq_refusing", default=False)


@contextlib.contextmanager
def _audit_shown() -> Iterator[None]:
    """Print the ``celery_delayq.audit`` lines of this run on stderr too (the operator sees what was done).

    A refusal's line is logged but not printed: its error line says it, and
    bad input answers with one line on stderr. The logger keeps its own
    handlers and propagation (a log shipper of the app's still gets every
    line); the level is lowered to INFO for the run only when nothing set it lower.
    """
    logger = logging.getLogger(AUDIT_LOGGER)
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if _printed_already(logger):  # the process prints log lines on stderr itself (a worker, the demo): once
        handler = logging.NullHandler()
    handler.setLevel(logging.INFO)
    handler.addFilter(lambda record: not _REFUSING.get())
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _printed_already(logger: logging.Logger) -> bool:
    """Does a handler on ``logger``'s way to the root already print its INFO lines on stderr?"""
    current: logging.Logger | None = logger
    while current is not None:
        for h in current.handlers:
            if isinstance(h, logging.StreamHandler) and h.stream in (sys.stderr, sys.__stderr__) \
                    and h.level <= logging.INFO:
                return True
        current = current.parent if current.propagate else None
    return False


class Action(click.Command):
    """A command that changes production state (``action``: its name in the audit line).

    Whatever stops it (bad input, a refused selection, no confirmation, an
    unknown id) is logged as an audit line with ``refused=``, with the ids it
    was given; the command logs what it did with :func:`audit_action`.
    """

    def __init__(self, *args: Any, action: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.action = action

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.Exit:
            raise
        except Exception as exc:
            self._refused(ctx, exc)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except (Exception, click.Abort) as exc:
            self._refused(ctx, exc)
            raise

    def _refused(self, ctx: click.Context, exc: BaseException) -> None:
        if isinstance(exc, click.Abort):
            why = "not confirmed at the prompt"
        elif isinstance(exc, click.ClickException):
            why = " ".join(exc.format_message().split())
        else:
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        token = _REFUSING.set(True)
        try:
            audit(self.action, who=cli_actor(), via="cli", ids=_given_ids(ctx), refused=why[:300])
        finally:
            _REFUSING.reset(token)


def _given_ids(ctx: click.Context) -> list[str]:
    """The ids the operator named (``TASK_ID``, ``--id``...), as text that can be logged."""
    ids: list[str] = []
    for key in ("task_id", "task_ids", "ids", "parked_id"):
        value = ctx.params.get(key)
        for item in (value if isinstance(value, (tuple, list)) else [value] if value else []):
            ids.append(str(item).encode("utf-8", "backslashreplace").decode("utf-8"))
    return ids


def audit_action(ctx: click.Context, *, ids: Iterable[str] = (), **details: Any) -> str:
    """Log the audit line of what the current :class:`Action` command did (who: :func:`cli_actor`)."""
    command = ctx.command
    action = command.action if isinstance(command, Action) else str(command.name)
    return audit(action, who=cli_actor(), via="cli", ids=ids, **details)


def _uri(ctx: click.Context) -> str:
    try:
        return app_context(ctx).uri
    except Exception:  # the app itself is broken: say so without a second traceback
        return "the app's broker"


def confirm(question: str, yes: bool, *, go_ahead: str = "--yes") -> None:
    """Go ahead with a destructive action only with ``--yes`` or an explicit "y" at a prompt.

    A non-interactive shell (a cron job, a pipeline) cannot answer, so it gets
    a refusal that says what to add (``go_ahead``), rather than a prompt that reads EOF.
    """
    if yes:
        return
    if sys.stdin is None or not sys.stdin.isatty():
        raise click.ClickException(f"{question.rstrip('?')}: not without {go_ahead} in a non-interactive shell. "
                                   f"Add {go_ahead} to go ahead.")
    click.confirm(question, abort=True)


def yes_option(command: Any) -> Any:
    """The ``-y/--yes`` flag every destructive command takes."""
    return click.option("-y", "--yes", is_flag=True, help="Go ahead without asking (needed when not interactive).")(command)


def bulk_options(noun: str) -> Callable[[Any], Any]:
    """``--all`` and ``--expect N``, the options of every bulk command (``noun``: what it selects)."""
    def add(command: Any) -> Any:
        command = click.option("--expect", type=click.IntRange(min=0), metavar="N", default=None,
                               help=f"With --yes: the number of {noun}s the dry run counted; when the "
                                    "selection now counts another number nothing is done.")(command)
        return click.option("--all", "everything", is_flag=True,
                            help=f"Select every {noun} (without a filter nothing is selected).")(command)
    return add


def check_bulk(*, described: str, everything: bool, dry_run: bool, yes: bool, expect: int | None,
               noun: str) -> None:
    """Refuse a bulk command before anything is read: no selection, or ``--yes`` without ``--expect``.

    ``described``: the filter as the options gave it (``""``: none). The rule
    is :func:`celery_delayq.inputs.require_selection`'s (the API's and the
    page's); at a terminal the prompt, which shows the count, confirms instead
    of ``--expect``.

    Raises:
        BadInput: no filter and no ``--all``, or both; ``--yes`` without ``--expect``.
    """
    require_selection(described=described, everything=everything, dry_run=True, expect=expect, noun=noun)
    if not dry_run and yes and expect is None:
        raise BadInput(f"--yes acts on a selection only with --expect N, the number of {noun}s it should "
                       "match: run the same command with --dry-run first to get the count")


def confirm_bulk(question: str, *, matched: int, expect: int | None, yes: bool, noun: str) -> None:
    """Go ahead with ``matched`` selected items: ``expect`` must equal it, then :func:`confirm` (``--yes`` or "y").

    Raises:
        BadInput: the selection counts another number than ``expect`` (nothing was changed).
    """
    if expect is not None and expect != matched:
        raise BadInput(describe_guard(expect, matched, noun))
    confirm(question, yes, go_ahead=f"--yes --expect {matched}")


class _NamingConsole(Console):
    """A rich console whose printed text names the app in ``celery -A APP`` hints (:func:`named`)."""

    def __init__(self, app: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hint = f"celery -A {app} "

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
        super().print(*(o.replace("celery -A APP ", self._hint) if isinstance(o, str) else o for o in objects),
                      **kwargs)


def console(ctx: click.Context | None = None) -> Console:
    """A rich console for people: no colour when Celery's ``--no-color`` is given; hints name the app."""
    no_color = bool(getattr(getattr(ctx, "obj", None), "no_color", False)) if ctx is not None else False
    return _NamingConsole(app_name(ctx), soft_wrap=True, highlight=False, no_color=no_color or None)
