"""``delayq run-now``, ``delayq reschedule`` and ``delayq cancel-matching``: act on waiting tasks.

``run-now`` and ``reschedule`` publish the task again and cancel its copy in the ladder by its pass, so it
runs once (:mod:`celery_delayq.cancels.reschedule`); ``cancel-matching`` cancels exactly the waiting tasks a
filter (or ``--all``) counted, by the bulk rule of :mod:`.base`. The due-time and bulk rules: docs/cancel.md.
"""

from __future__ import annotations

import json

import click

from ..cancels import cancel as cancel_tasks
from ..cancels.reschedule import reschedule as move
from ..pending.browse import WaitingFilter, page_of
from ..index.query import iso
from ..inputs import DUE_FORMS
from .base import (Action, app_context, audit_action, bulk_options, check_bulk, confirm, confirm_bulk, console,
                   yes_option)
from ..options import DueTime, Id, Moment

__all__ = ["run_now", "reschedule", "cancel_matching"]


#: Due times look ahead: ``--due-before 10m`` is ten minutes from now.
_DUE = Moment("ahead")


@click.command(name="run-now", cls=Action, action="run-now")
@click.argument("task_id", type=Id("task id"))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@yes_option
@click.pass_context
def run_now(ctx: click.Context, task_id: str, as_json: bool, yes: bool) -> None:
    """Run a waiting task now (its copy in the ladder is cancelled, so it runs once)."""
    _move(ctx, task_id, None, f"Run task {task_id} now?", as_json, yes)


@click.command(name="reschedule", cls=Action, action="reschedule",
               help=f"Move a waiting task to WHEN: {DUE_FORMS}.",
               context_settings={"ignore_unknown_options": True})  # so that `-5m` is read (and refused) as a time
@click.argument("task_id", type=Id("task id"))
@click.argument("when", type=DueTime())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@yes_option
@click.pass_context
def reschedule(ctx: click.Context, task_id: str, when: float, as_json: bool, yes: bool) -> None:
    _move(ctx, task_id, when, f"Move task {task_id} to {iso(when)}?", as_json, yes)


def _move(ctx: click.Context, task_id: str, due: float | None, question: str, as_json: bool, yes: bool) -> None:
    """Publish the task again due at ``due`` (None: now) once the operator said yes, and say what moved."""
    from ..glue.integration import install

    app = app_context(ctx)
    confirm(question, yes)
    install(app.app)  # the moved copy is published through the ladder
    done = move(app.app, task_id, due=due)
    audit_action(ctx, ids=[done.old.task_id], task=done.old.task_name, was_due=done.old.due_iso,
                 due=iso(due) if due is not None else "now")
    if as_json:
        click.echo(json.dumps(done.as_dict()))
        return
    new = done.as_dict()["due"]
    what = f"now due {new}" if new else "runs now"
    console(ctx).print(f"task {task_id} ({done.old.task_name}) {what}; was due {done.old.due_iso}")


def _described(match: WaitingFilter) -> str:
    """The filter as the options gave it, times in UTC (``""``: no filter)."""
    parts = [f"{name} {value}" for name, value in (
        ("--task", match.task), ("--queue", match.queue), ("--id-prefix", match.id_prefix), ("--args", match.text))
        if value]
    parts += [f"{name} {iso(value)}" for name, value in (("--due-after", match.due_after),
                                                          ("--due-before", match.due_before)) if value is not None]
    return " ".join(parts + (["--retries"] if match.retries_only else []))


@click.command(name="cancel-matching", cls=Action, action="cancel-matching")
@click.option("--task", "task_glob", metavar="GLOB", help="Task names matching this glob.")
@click.option("--queue", metavar="NAME", help="Tasks for this queue (or routing key).")
@click.option("--id-prefix", metavar="PREFIX", type=Id("--id-prefix"), help="Task ids starting with this.")
@click.option("--args", "text", metavar="TEXT", help="Arguments containing this text (case-insensitive).")
@click.option("--due-after", metavar="WHEN", type=_DUE, help=_DUE.help("Due at or after"))
@click.option("--due-before", metavar="WHEN", type=_DUE, help=_DUE.help("Due before"))
@click.option("--retries", is_flag=True, help="Only retries.")
@bulk_options("waiting task")
@click.option("--dry-run", is_flag=True, help="Only count the matching tasks (the N of --expect N).")
@yes_option
@click.pass_context
def cancel_matching(ctx: click.Context, task_glob: str | None, queue: str | None, id_prefix: str | None,
                    text: str | None, due_after: float | None, due_before: float | None, retries: bool,
                    everything: bool, expect: int | None, dry_run: bool, yes: bool) -> None:
    """Cancel every waiting task matching the filters (or --all), exactly those counted.

    Count first with --dry-run; then --yes --expect N acts when the filters
    still match N tasks (at a terminal, answering the prompt does instead).
    """
    match = WaitingFilter(task=task_glob, queue=queue, id_prefix=id_prefix, text=text, due_after=due_after,
                          due_before=due_before, retries_only=retries)
    described = _described(match)
    check_bulk(described=described, everything=everything, dry_run=dry_run, yes=yes, expect=expect,
               noun="waiting task")
    what = described or "--all"
    app = app_context(ctx)
    out = console(ctx)
    page = page_of(app.app, match, limit=10**9)
    if dry_run:
        out.print(f"{page.total:,} waiting task(s) match {what} (dry run: nothing cancelled)"
                  + (f"; to cancel them: --yes --expect {page.total}" if page.total else ""))
        return
    if not page.items and not expect:  # --expect 3 when nothing matches now is a refusal, below
        out.print(f"no waiting task matches {what}; nothing cancelled")
        return
    confirm_bulk(f"Cancel {page.total:,} waiting task(s) matching {what}?", matched=page.total, expect=expect,
                 yes=yes, noun="waiting task")
    ids = [t.task_id for t in page.items]
    cancel_tasks(app.app, *ids, lookup=False)
    audit_action(ctx, ids=ids, filter=what)
    out.print(f"cancelled {len(ids):,} task(s) matching {what}; they will not run")
