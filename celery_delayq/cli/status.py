"""``delayq status [--json]``: what waits in the ladder, what is parked, what could not be routed.

:mod:`celery_delayq.rabbitmq.status` reads the document (passive declares: a missing ladder is said, not
created); this module prints it, or its JSON, with ``totals.cancelled`` from the cancel log added. Exit
status 1 when there is no ladder of the app's name and shape.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from ..ladder.humanize import describe_ladder, human_duration
from ..ladder.spec import LadderSpec
from ..glue.app_ladder import AppLadder
from ..rabbitmq.client import Connection
from ..rabbitmq.probe import queue_depth
from ..rabbitmq.status import ladder_status
from .base import app_context, console, named
from .topology import no_ladder

__all__ = ["status"]


#: Status is read at a terminal beside other windows: it wraps at 80 columns, however wide the terminal.
WIDTH = 80


def _render(doc: dict[str, Any], ctx: click.Context) -> None:
    out = console(ctx)
    out.soft_wrap, out.width = False, min(out.width, WIDTH)
    spec = LadderSpec(prefix=doc["ladder"]["prefix"], unit_ms=doc["ladder"]["unit_ms"],
                      levels=doc["ladder"]["levels"], radix=doc["ladder"]["radix"],
                      shards=doc["ladder"].get("shards", 1))
    table = Table(title=f"{describe_ladder(spec)}\n{doc['broker']}", title_justify="left")
    for column in ("level", "waits", "messages", "due within"):
        table.add_column(column, justify="right")
    clustered = len(doc.get("nodes") or ()) > 1
    if clustered:
        table.add_column("leaders")
    for lv in doc["levels"]:
        ttls = [q["ttl_s"] for q in lv["queues"]]
        waits = human_duration(ttls[0]) if len(ttls) == 1 else f"{human_duration(ttls[0])} – {human_duration(ttls[-1])}"
        count = f"{lv['messages']:,}" if lv["messages"] else "[dim]0[/dim]"
        count = count if all(q["exists"] for q in lv["queues"]) else "[red]missing[/red]"
        due = human_duration(lv["due_within_s"]) if lv["due_within_s"] is not None else ""
        row = [f"L{lv['level']:02d}", waits, count, due]
        if clustered:
            row.append(" ".join(_short_node(q.get("leader")) for q in lv["queues"]))
        table.add_row(*row)
    out.print(table)
    totals = doc["totals"]
    parked = f"parked {totals['parked']:,}" + ("" if doc["parking"]["exists"] else " (no parking queue yet)")
    unroutable = f"unroutable {totals['unroutable']:,}"
    if totals["unroutable"]:
        unroutable = f"[yellow]{unroutable}[/yellow] (in {doc['unroutable']['queue']}: no exit queue for their destination)"
    waiting = f"waiting {totals['waiting']:,}"
    if totals.get("cancelled"):
        waiting += (f" (of which {totals['cancelled']:,} cancelled, dropped when they arrive; "
                    f"`delayq pending` lists the other {max(0, totals['waiting'] - totals['cancelled']):,})")
    out.print(f"{waiting} · {parked} · {unroutable}")
    if spec.shards > 1:
        per_shard = [0] * spec.shards
        for lv in doc["levels"]:
            for q in lv["queues"]:
                per_shard[q.get("shard", 0)] += q["messages"]
        out.print("waiting per shard: " + " · ".join(f"s{i} {n:,}" for i, n in enumerate(per_shard)))
    bounds = [lv["due_within_s"] for lv in doc["levels"] if lv["due_within_s"] is not None]
    if bounds:
        out.print(f"due: the next within {human_duration(min(bounds))}, all within {human_duration(max(bounds))} "
                  f"(by {doc['all_due_by']}); upper bounds from the queue TTLs, as RabbitMQ cannot show a "
                  "message's due time without dequeuing it")
    if clustered and doc["leaders"]:
        shown = ", ".join(f"{node} {n}" for node, n in doc["leaders"].items())
        line = f"leaders over {len(doc['leaders'])} of {len(doc['nodes'])} nodes: {shown}"
        if len(doc["leaders"]) == 1:
            line = (f"[yellow]{line}[/yellow]: one node does every level's dead-letter work; "
                    "`celery -A APP delayq topology verify` says how to spread them")
        out.print(line)
    if clustered and doc.get("leaders_by_kind"):
        out.print(_leaders_table(doc["leaders_by_kind"], doc["nodes"]))
    stuck = doc.get("held") or {}
    if stuck:
        shown = ", ".join(f"{name} {n:,}" for name, n in sorted(stuck.items())[:4]) + (" ..." if len(stuck) > 4 else "")
        out.print(f"[yellow]held {sum(stuck.values()):,}[/yellow] in {len(stuck)} queue(s) that do not pass them on "
                  f"({shown}). After a broker restart: `celery -A APP delayq topology recover`. An exit queue "
                  "keeps them until its destination exchange has a binding for their routing key.")
    for old in doc.get("previous_shapes") or ():
        if not old["exists"]:
            out.print(f"previous shape {old['shape']}: deleted (delayq_previous_shapes may drop it)")
        elif old["waiting"]:
            out.print(f"previous shape {old['shape']}: {old['waiting']:,} still waiting (delivered from it when due)")
        else:
            out.print(f"previous shape {old['shape']}: drained; remove it with "
                      f"`celery -A APP delayq topology delete --shape {old['shape']}`")
    if not doc["complete"]:
        shown = ", ".join(doc["missing"][:4]) + (" ..." if len(doc["missing"]) > 4 else "")
        out.print(f"[red]incomplete:[/red] {len(doc['missing'])} missing ({shown}); "
                  "`celery -A APP delayq topology verify` names them all")


def _previous_shapes(app: AppLadder, raw: Connection) -> list[dict[str, Any]]:
    """What still waits in the ladders of ``delayq_previous_shapes`` (``exists`` false once deleted)."""
    shapes = []
    for spec in app.config.previous_specs:
        depths = [queue_depth(raw, q.name) for q in spec.level_queues()]
        present = [d for d in depths if d is not None]
        shapes.append({"shape": f"{spec.levels}x{spec.radix}", "exists": bool(present), "waiting": sum(present)})
    return shapes


def _cancelled_waiting(app: AppLadder) -> int | None:
    """Cancelled tasks still in the ladder's queues (found waiting, not due yet); None when unreadable."""
    from ..glue.app_ladder import index_of
    from ..index.cancel_log import read_cancel_book

    try:
        return len(read_cancel_book(*index_of(app.app)).still_due())
    except Exception:  # noqa: BLE001 - no streams, no cancel log yet: status still answers
        return None


#: The order of the kinds in the leaders table: the ladder's own queues, then those made later.
_KINDS = ("levels", "unroutable", "laps", "index", "cancels", "parking", "exits")


def _leaders_table(by_kind: dict[str, dict[str, int]], nodes: list[str]) -> Table:
    """Queues each node leads, per kind of queue the ladder owns (a kind all on one node in yellow)."""
    table = Table(title="leaders per node, by kind of queue", title_justify="left")
    table.add_column("queues")
    shown = sorted(set(nodes) | {n for per in by_kind.values() for n in per})
    for node in shown:
        table.add_column(_short_node(node), justify="right")
    for kind in sorted(by_kind, key=lambda k: (_KINDS.index(k) if k in _KINDS else len(_KINDS), k)):
        per = by_kind[kind]
        lopsided = len(per) == 1 and sum(per.values()) >= len(shown) > 1
        label = f"[yellow]{kind}[/yellow]" if lopsided else kind
        table.add_row(label, *[str(per.get(node, 0)) if per.get(node) else "[dim]0[/dim]" for node in shown])
    return table


def _short_node(node: str | None) -> str:
    """A node name's part before ``@``, to keep the table narrow (the line below it names nodes in full)."""
    return "?" if not node else node.split("@", 1)[0]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table (keys listed above).")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show what waits in each ladder level, what is parked and what was unroutable. Creates nothing.

    With --json, one object: schema, observed_at, broker, ladder, exists, complete, missing,
    totals {waiting, parked, unroutable}, levels [{level, messages, due_within_s, queues}],
    parking, unroutable, next_due_by, all_due_by, previous_shapes [{shape, exists, waiting}]. Exit status 1 when the ladder does not exist.
    """
    app = app_context(ctx)
    with app.connected() as raw:
        doc = ladder_status(app, raw)
        missing_text = None if doc["exists"] else no_ladder(app, raw)
        doc["previous_shapes"] = _previous_shapes(app, raw)
    doc["totals"]["cancelled"] = _cancelled_waiting(app) if doc["exists"] else None
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        if missing_text:
            click.echo(named(ctx, missing_text), err=True)
            ctx.exit(1)
        return
    if missing_text:
        raise click.ClickException(missing_text)
    _render(doc, ctx)
