"""``celery -A APP delayq pending``: the delayed tasks and retries waiting in the ladder.

Reads the ladder's index (:mod:`celery_delayq.pending`); the ladder itself is
not touched, so nothing is delivered early, late or twice because of it.
``--json`` prints a JSON array of objects with the keys ``task_id``,
``task``, ``exchange``, ``routing_key``, ``queue``, ``due`` (ISO 8601 UTC)
and ``attempt``; an empty result is ``[]``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.table import Table

from ..humanize import human_duration
from ..pending import pending as find_pending
from .base import app_context, console
from .when import Moment

__all__ = ["pending"]

#: Rows the table shows unless --limit says otherwise (--json shows all).
_TABLE_ROWS = 200
#: Due times look ahead: ``--due-before 10m`` is ten minutes from now.
_DUE = Moment("ahead")


@click.command(name="pending")
@click.option("--task", "task_glob", metavar="GLOB", help="Only task names matching this glob (proj.tasks.*).")
@click.option("--queue", metavar="NAME", help="Only tasks for this queue (or routing key, when the queue is not known).")
@click.option("--id", "task_id", metavar="TASK_ID", help="Only this task id (the fast lookup: one index shard).")
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
    _table(ctx, found, now, limit if limit is not None else _TABLE_ROWS, time.monotonic() - started)


def _table(ctx: click.Context, found: list[Any], now: float, limit: int, took: float) -> None:
    out = console(ctx)
    if not found:
        out.print(f"no delayed task is waiting in the ladder (read in {human_duration(took)})")
        return
    table = Table(title=f"{len(found):,} waiting (read in {human_duration(took)})", title_justify="left")
    table.add_column("task id", no_wrap=True)  # ids are copied from here: never broken
    table.add_column("task")
    table.add_column("destination")
    table.add_column("due (UTC)", no_wrap=True)
    table.add_column("in", justify="right", no_wrap=True)
    table.add_column("attempt", justify="right")
    for t in found[:limit]:
        table.add_row(t.task_id, t.task_name or "-", t.destination, t.due_iso, human_duration(t.due - now),
                      str(t.attempt))
    out.print(table)
    if len(found) > limit:
        out.print(f"... and {len(found) - limit:,} more (--limit N, or --json for all)")
