"""``delayq run-now``, ``delayq reschedule`` and ``delayq cancel-matching``: act on waiting tasks.

``run-now`` and ``reschedule`` publish the task again (same id, name,
destination, attempt and arguments) and cancel the copy still in the ladder
by its pass, so it runs once (:mod:`celery_delayq.cancels.supersede`).
``cancel-matching`` counts the waiting tasks a filter matches, asks, and
cancels exactly that many (``--dry-run`` only counts). The web page and its
API (``delayq web``) do the same through the same functions.
"""

from __future__ import annotations

import json
from typing import Any

import click

from ..cancels import cancel as cancel_tasks
from ..cancels.supersede import reschedule as move
from ..pending.browse import WaitingFilter, page_of
from ..pending.query import iso
from .base import app_context, confirm, console, yes_option
from .when import Moment
from ..typing import CeleryApp

__all__ = ["run_now", "reschedule", "cancel_matching"]


def _installed(app: CeleryApp) -> Any:
    """The app with the ladder installed: the moved copy is published through it."""
    from ..glue.integration import install

    install(app)
    return app


#: Due times look ahead: ``--due-before 10m`` is ten minutes from now.
_DUE = Moment("ahead")


@click.command(name="run-now")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@yes_option
@click.pass_context
def run_now(ctx: click.Context, task_id: str, as_json: bool, yes: bool) -> None:
    """Run a waiting task now (its copy in the ladder is cancelled, so it runs once)."""
    _move(ctx, task_id, None, f"Run task {task_id} now?", as_json, yes)


@click.command(name="reschedule")
@click.argument("task_id")
@click.argument("when", type=_DUE)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@yes_option
@click.pass_context
def reschedule(ctx: click.Context, task_id: str, when: float, as_json: bool, yes: bool) -> None:
    """Move a waiting task to WHEN: ISO 8601 (UTC unless it has an offset), epoch seconds, or a duration from now (90s, 10m, 2h, 3d)."""
    _move(ctx, task_id, when, f"Move task {task_id} to {iso(when)}?", as_json, yes)


def _move(ctx: click.Context, task_id: str, due: float | None, question: str, as_json: bool, yes: bool) -> None:
    """Publish the task again due at ``due`` (None: now) once the operator said yes, and say what moved."""
    app = app_context(ctx)
    confirm(question, yes)
    done = move(_installed(app.app), task_id, due=due)
    if as_json:
        click.echo(json.dumps(done.as_dict()))
        return
    new = done.as_dict()["due"]
    what = f"now due {new}" if new else "runs now"
    console(ctx).print(f"task {task_id} ({done.old.task_name}) {what}; was due {done.old.due_iso}")


@click.command(name="cancel-matching")
@click.option("--task", "task_glob", metavar="GLOB", help="Task names matching this glob.")
@click.option("--queue", metavar="NAME", help="Tasks for this queue (or routing key).")
@click.option("--id-prefix", metavar="PREFIX", help="Task ids starting with this.")
@click.option("--args", "text", metavar="TEXT", help="Arguments containing this text (case-insensitive).")
@click.option("--due-after", metavar="WHEN", type=_DUE, help=_DUE.help("Due at or after"))
@click.option("--due-before", metavar="WHEN", type=_DUE, help=_DUE.help("Due before"))
@click.option("--retries", is_flag=True, help="Only retries.")
@click.option("--dry-run", is_flag=True, help="Only count the matching tasks.")
@yes_option
@click.pass_context
def cancel_matching(ctx: click.Context, task_glob: str | None, queue: str | None, id_prefix: str | None,
                    text: str | None, due_after: float | None, due_before: float | None, retries: bool,
                    dry_run: bool, yes: bool) -> None:
    """Cancel every waiting task matching the filters (at least one filter is needed)."""
    match = WaitingFilter(task=task_glob, queue=queue, id_prefix=id_prefix, text=text, due_after=due_after,
                          due_before=due_before, retries_only=retries)
    if not match.describe():
        raise click.UsageError("give at least one filter (--task, --queue, --id-prefix, --args, --due-after, "
                               "--due-before, --retries); to cancel by id use `delayq cancel`")
    app = app_context(ctx)
    out = console(ctx)
    page = page_of(app.app, match, limit=10**9)
    if not page.items:
        out.print(f"no waiting task matches {match.describe()}; nothing cancelled")
        return
    if dry_run:
        out.print(f"{page.total:,} waiting task(s) match {match.describe()} (dry run: nothing cancelled)")
        return
    confirm(f"Cancel {page.total:,} waiting task(s) matching {match.describe()}?", yes)
    cancel_tasks(app.app, *[t.task_id for t in page.items], lookup=False)
    out.print(f"cancelled {page.total:,} task(s) matching {match.describe()}; they will not run")
