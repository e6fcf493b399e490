"""``delayq doctor [--json]``: a read-only switch-over check, one finding per question (:mod:`celery_delayq.doctor`).

This module prints the findings (a table, or ``--json``'s array) and exits 1 when any is an ``error``.
"""

from __future__ import annotations

import json
import math

import click

from kombu.utils.imports import symbol_by_name

from ..doctor import ERROR, OK, WARN, Finding, diagnose
from ..glue.app_ladder import AppLadder, ladder_for
from ..glue.extensions import Extension, enabled_extensions
from ..typing import CeleryApp
from .base import app_context, console, named

__all__ = ["doctor"]

_MARK = {OK: "[green]ok   [/green]", WARN: "[yellow]warn [/yellow]", ERROR: "[red]error[/red]"}


def extension_lines(app: CeleryApp) -> list[str]:
    """One line per extension the app's ladder has (or would have once installed): its name, what it does."""
    ladder = ladder_for(app)
    extensions: list[Extension[AppLadder]] = list(ladder.extensions.values())
    if not ladder.installed:  # this process did not install it: what install() would build
        extensions = [symbol_by_name(path)() for path in enabled_extensions(ladder.config.disabled_extensions).values()]
    return [f"{e.name}: {e.describe(ladder)}" for e in extensions]


def _render(findings: list[Finding], ctx: click.Context, uri: str, extensions: list[str]) -> None:
    out = console(ctx)
    out.print(f"delayq doctor · {uri}")
    out.print("extensions (delayq_disabled_extensions leaves one out):")
    for line in extensions:
        out.print(f"   {line}")
    for f in findings:
        out.print(f"{_MARK.get(f.status, f.status)} [bold]{f.check}[/bold]: {f.summary}")
        out.print(f"   [dim]→[/dim] {f.next_step}")
    counts = {s: sum(1 for f in findings if f.status == s) for s in (OK, WARN, ERROR)}
    out.print(f"{counts[OK]} ok · {counts[WARN]} warn · {counts[ERROR]} error")


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A number of seconds, not ``nan`` (which every range comparison lets through)."""
    if math.isnan(value):
        raise click.BadParameter("nan is not a number of seconds", ctx=ctx, param=param)
    return value


@click.command()
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON array of {check, status, summary, next_step, details} instead of the table.")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=600.0), default=2.0, show_default=True,
              callback=_finite, help="Seconds to wait for workers to answer `inspect scheduled` (0.1 to 600).")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, timeout: float) -> None:
    """Check, read-only, whether this app can switch to the ladder (or back) without losing a task.

    Broker version and feature flags, the ladder and its arguments, leaders' spread, the parking queue,
    whether delayq_enabled is really active, ETA tasks held by workers, Celery's native delayed-delivery
    queues and delayed-message-plugin exchanges. Each finding says what to do next. Exit status 1 when
    any finding is an error.
    """
    app = app_context(ctx)
    with app.connected() as raw:
        spec = ctx.find_root().params.get("app")  # the -A value, when a string: to probe a fresh process
        findings = diagnose(app, raw, inspect_timeout=timeout,
                            app_spec=spec if isinstance(spec, str) and spec else None)
    if as_json:
        docs = [{**f.as_dict(), "next_step": named(ctx, f.next_step)} for f in findings]
        click.echo(json.dumps(docs, indent=2, default=str))
    else:
        _render(findings, ctx, app.uri, extension_lines(app.app))
    if any(f.status == ERROR for f in findings):
        ctx.exit(1)
