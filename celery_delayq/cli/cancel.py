"""``celery -A APP delayq cancel TASK_ID...``: cancel delayed tasks for good (docs/cancel.md).

Each cancel is recorded in the ladder's cancel log, confirmed, before the command returns; like ``celery
control revoke`` it acts on the ids given without asking. An id must name one waiting task (its full id or a
unique start; else exit status 1, nothing recorded) unless ``--force`` records it as given.
"""

from __future__ import annotations

import json
import time

import click

from ..cancels import cancel as cancel_tasks
from ..ladder.humanize import human_duration
from ..index.query import iso
from .base import Action, app_context, audit_action, console
from ..options import Id

__all__ = ["cancel"]


@click.command(name="cancel", cls=Action, action="cancel")
@click.argument("task_ids", nargs=-1, required=True, metavar="TASK_ID...", type=Id("task id"))
@click.option("--force", is_flag=True,
              help="Also record ids that name no waiting task, as given (a task not published yet); each holds "
                   "for the ladder's maximum delay plus a day.")
@click.option("--no-lookup", is_flag=True,
              help="Do not look the ids up in the index first (no check, no prefixes: every id is recorded as "
                   "given and holds for the ladder's maximum delay plus a day).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per id.")
@click.pass_context
def cancel(ctx: click.Context, task_ids: tuple[str, ...], force: bool, no_lookup: bool, as_json: bool) -> None:
    """Cancel delayed tasks by id (or a unique start of it): they will not run, even after worker restarts."""
    app = app_context(ctx)
    results = cancel_tasks(app.app, *task_ids, lookup=not no_lookup, force=force)
    audit_action(ctx, ids=[r.task_id for r in results], waiting=sum(1 for r in results if r.found is not None),
                 force=force or None, no_lookup=no_lookup or None)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in results]))
        return
    out = console(ctx)
    now = time.time()
    for r in results:
        if r.found is not None:
            out.print(f"cancelled {r.task_id}: {r.found.task_name or 'message'} was waiting, due "
                      f"{r.found.due_iso} (in {human_duration(r.found.due - now)}); it will not run")
        elif no_lookup:
            out.print(f"cancelled {r.task_id}: it will not run if it arrives before {iso(r.until)}")
        else:
            out.print(f"cancelled {r.task_id} (--force): not waiting in the ladder now; it will not run if it "
                      f"arrives before {iso(r.until)}")
