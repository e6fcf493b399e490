"""``celery -A APP delayq pending``: the delayed tasks and retries waiting in the ladder (docs/operations.md).

Reads the ladder's index (:mod:`celery_delayq.pending`), never the ladder itself, so nothing is delivered
early, late or twice because of it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich import box
from rich.markup import escape
from rich.table import Table

from ..ladder.humanize import human_duration
from ..pending import pending as find_pending
from ..index.query import iso
from .base import app_context, console
from ..options import Id, Moment

__all__ = ["pending"]

#: Rows the table shows unless --limit says otherwise (--json shows all).
_TABLE_ROWS = 200
#: Due times look ahead: ``--due-before 10m`` is ten minutes from now.
_DUE = Moment("ahead")


@click.command(name="pending")
@click.option("--task", "task_glob", metavar="GLOB", help="Only task names matching this glob (proj.tasks.*).")
@click.option("--queue", metavar="NAME", help="Only tasks for this queue (or routing key, when the queue is not known).")
@click.option("--id", "task_id", metavar="TASK_ID", type=Id("--id"),
              help="Only this task: its id (the fast lookup: one index shard) or a unique start of one.")
@click.option("--due-before", metavar="WHEN", type=_DUE, help=_DUE.help("Only tasks due before"))
@click.option("--due-after", metavar="WHEN", type=_DUE, help=_DUE.help("Only tasks due at or after"))
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help=f"Show at most this many, soonest due first (table default {_TABLE_ROWS}; --json: all).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of objects ([] when none).")
@click.pass_context
def pending(ctx: click.Context, task_glob: str | None, queue: str | None, task_id: str | None,
            due_before: float | None, due_after: float | None, limit: int | None, as_json: bool) -> None:
    """List the delayed tasks and retries waiting in the ladder, soonest due first."""
    app = app_context(ctx)
    started = time.monotonic()
    now = time.time()
    found = find_pending(app.app, task=task_glob, queue=queue, task_id=task_id, due_before=due_before,
                         due_after=due_after, now=now)
    if as_json:
        shown = found if limit is None else found[:limit]
        click.echo(json.dumps([t.as_dict() for t in shown], indent=None))
        return
    # The filters given, as the options that gave them (for "no waiting task matches ...").
    given = [f"{name} {value}" for name, value in (("--task", task_glob), ("--queue", queue), ("--id", task_id))
             if value]
    given += [f"{name} {iso(value)}" for name, value in (("--due-before", due_before), ("--due-after", due_after))
              if value is not None]
    _table(ctx, found, now, limit if limit is not None else _TABLE_ROWS, time.monotonic() - started, " ".join(given))


#: Below this many columns (and when piped: rich assumes 80) a task takes two lines.
_WIDE = 120


def _table(ctx: click.Context, found: list[Any], now: float, limit: int, took: float, filters: str = "") -> None:
    out = console(ctx)
    if not found:
        what = f"no waiting task matches {filters}" if filters else "no delayed task is waiting in the ladder"
        out.print(f"{what} (read in {human_duration(took)})")
        return
    title = f"{len(found):,} waiting{' matching ' + filters if filters else ''} (read in {human_duration(took)})"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    wide = out.width >= _WIDE
    table.add_column("task id" if wide else "task id / task, destination", no_wrap=wide, overflow="fold")
    if wide:
        table.add_column("task", overflow="fold")
        table.add_column("destination", overflow="fold")
    table.add_column("due (UTC)", no_wrap=True)
    table.add_column("in", justify="right", no_wrap=True)
    table.add_column("try", justify="right", no_wrap=True)
    for t in found[:limit]:
        due = t.due_iso[:19].replace("T", " ")
        if wide:
            table.add_row(t.task_id, t.task_name or "-", t.destination, due, human_duration(t.due - now),
                          str(t.attempt))
        else:  # the id on a line of its own (it is copied from here: never broken), then what and where
            table.add_row(f"{t.task_id}\n[dim]{escape(t.task_name or '-')}, {escape(t.destination)}[/dim]",
                          due, human_duration(t.due - now), str(t.attempt))
    out.print(table)
    if len(found) > limit:
        out.print(f"... and {len(found) - limit:,} more (--limit N, or --json for all)")
