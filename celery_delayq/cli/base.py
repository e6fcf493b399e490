"""What every ``delayq`` sub-command shares: the app, its broker, short errors, confirmation.

* :class:`DelayqGroup` turns the errors an operator meets (broker down, login
  refused, a :class:`~celery_delayq.errors.DelayqError`) into one line that
  names the broker URL (password masked) and the cause, with exit status 1.
  It is the only place that does so; commands just let errors rise.
* :func:`app_context` gives commands the app's
  :class:`~celery_delayq.rabbitmq.context.AppContext` (settings and a
  connection without the ladder hook, so reading commands cannot write).
* :func:`confirm` is the one confirmation rule of every destructive command.
* :func:`named` puts the app's own name into the ``celery -A APP ...`` hints
  that the layers below write without knowing it.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import amqp
import click
import kombu.exceptions
from rich.console import Console

from ..errors import DelayqError
from ..rabbitmq.context import AppContext

__all__ = ["DelayqGroup", "app_context", "app_name", "confirm", "console", "named", "yes_option"]

#: Failures to reach or log in to the broker, whichever layer raises them.
_CONNECTION_ERRORS = (OSError, kombu.exceptions.OperationalError, amqp.exceptions.ConnectionError)


def app_context(ctx: click.Context) -> AppContext:
    """The :class:`AppContext` of this CLI run (from Celery's ``-A``), made once."""
    root = ctx.find_root()
    found = root.meta.get("delayq.app")
    if found is None:
        app = getattr(ctx.obj, "app", None)
        if app is None:
            raise click.UsageError("no Celery app: run as `celery -A YOUR_APP delayq ...`")
        found = root.meta["delayq.app"] = AppContext(app)
    return found


def app_name(ctx: click.Context | None) -> str:
    """How the operator names the app: the ``-A`` value given to ``celery``, else the app's ``main``, else ``APP``.

    The ``-A`` text is what they typed (``proj``, ``proj.celery:app``), so a
    hint that repeats it can be pasted back as it is. An app's ``main`` is the
    name it was created with (``Celery("shop")``), a fair guess when it was
    handed over without ``-A`` (tests, embedding); ``__main__`` is not a name.
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
    """The ``delayq`` group: runs a sub-command and turns known failures into one line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if type(exc) is click.ClickException and "celery -A APP " in exc.message:
                raise click.ClickException(named(ctx, exc.message)) from None
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except DelayqError as exc:
            raise click.ClickException(named(ctx, str(exc))) from None
        except _CONNECTION_ERRORS as exc:
            raise click.ClickException(
                f"cannot reach RabbitMQ at {_uri(ctx)}: {_cause(exc)}. Check that the broker runs "
                "and that broker_url (or delayq_broker_url) points at it.") from None
        except amqp.exceptions.AMQPError as exc:
            # Login and permission refusals are channel errors in py-amqp (403 ACCESS_REFUSED).
            raise click.ClickException(f"RabbitMQ at {_uri(ctx)} refused: {_cause(exc)}") from None


def _uri(ctx: click.Context) -> str:
    try:
        return app_context(ctx).uri
    except Exception:  # the app itself is broken: say so without a second traceback
        return "the app's broker"


def confirm(question: str, yes: bool) -> None:
    """Go ahead with a destructive action only with ``--yes`` or an explicit "y" at a prompt.

    A non-interactive shell (a cron job, a pipeline) cannot answer, so it gets
    a refusal that says what to add, rather than a prompt that reads EOF.
    """
    if yes:
        return
    if not (sys.stdin is not None and sys.stdin.isatty()):
        raise click.ClickException(f"{question.rstrip('?')}: not without --yes in a non-interactive shell. "
                                   "Add --yes to go ahead.")
    click.confirm(question, abort=True)


def yes_option(command: Any) -> Any:
    """The ``-y/--yes`` flag every destructive command takes."""
    return click.option("-y", "--yes", is_flag=True, help="Go ahead without asking (needed when not interactive).")(command)


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
