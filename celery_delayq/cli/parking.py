"""``celery -A proj delayq parking ...``: list, inspect, replay and purge parked messages.

Works on the app's parking queue (``delayq_parking_queue``) unless ``--queue`` names another; reading
commands leave it as it was. ``replay`` and ``purge`` act on exactly the messages counted (filters, ``--id``
or ``--all``), confirmed by the bulk rule of :mod:`.base`, each an audit line: docs/operations.md, docs/retries.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ..parking import ParkedFilter, ParkedMessage, ParkingQueue
from ..parking import record as R
from ..rabbitmq.probe import destination_exists, queue_exists
from .base import Action, app_context, audit_action, bulk_options, check_bulk, confirm_bulk, console, yes_option
from ..options import Delay, Id, Moment

__all__ = ["parking"]

#: Parking times look back: ``--since 2h`` is two hours ago.
_PARKED = Moment("ago")
#: How many candidates an ambiguous id lists.
_CANDIDATES = 10
#: Headers ``inspect`` already shows as metadata (the traceback above all): not repeated.
_SHOWN_HEADERS = frozenset(R.FAILURE_HEADERS)


def _filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options every sub-command shares: which queue, and which of its messages."""
    for option in reversed([
        click.option("-q", "--queue", default=None, help="Parking queue (default: the app's delayq_parking_queue)."),
        click.option("--task", default=None, help="Only tasks whose name matches this glob."),
        click.option("--exception", default=None, help="Only exceptions whose type matches this glob."),
        click.option("--since", metavar="WHEN", type=_PARKED, default=None, help=_PARKED.help("Parked at or after")),
        click.option("--until", metavar="WHEN", type=_PARKED, default=None, help=_PARKED.help("Parked before")),
        click.option("--id", "ids", multiple=True, type=Id("--id"),
                     help="Parked id, or enough of its start to be unique (repeatable)."),
    ]):
        command = option(command)
    return command


def _match(task: str | None, exception: str | None, since: float | None, until: float | None,
           ids: tuple[str, ...]) -> ParkedFilter:
    return ParkedFilter(task=task, exception=exception, ids=tuple(ids), since=since, until=until)


def _described(task: str | None, exception: str | None, since: float | None, until: float | None,
               ids: tuple[str, ...]) -> str:
    """The filters given, as the options that gave them (times in UTC, as the CLI reads them)."""
    parts = [f"{name} {value}" for name, value in (("--task", task), ("--exception", exception)) if value]
    parts += [f"{name} {_when(value)}" for name, value in (("--since", since), ("--until", until)) if value is not None]
    parts += [f"--id {i}" for i in ids]
    return " ".join(parts)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@contextlib.contextmanager
def _bar(label: str, out: Console) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar, fed by the ``(done, total)`` callbacks it gives."""
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=out,
                  transient=True) as progress:
        task_id = progress.add_task(label, total=None)
        yield lambda done, total: progress.update(task_id, completed=done, total=total)


def _candidates(pq: ParkingQueue, prefix: str, found: list[ParkedMessage], *, more: bool) -> click.ClickException:
    """The error for an id prefix that names more than one parked message, listing them."""
    lines = [f"{len(found)}{'+' if more else ''} parked messages in {pq.name!r} have an id starting with "
             f"{prefix!r}; give more of the id:"]
    for p in found[:_CANDIDATES]:
        lines.append(f"  {p.parked_id}  {_when(p.parked_at)}  {p.task} [{p.task_id}]  {p.exc_type.rsplit('.', 1)[-1]}")
    return click.ClickException("\n".join(lines))


def _select(pq: ParkingQueue, match: ParkedFilter, ids: tuple[str, ...], described: str,
            limit: int | None = None) -> list[ParkedMessage]:
    """The messages a bulk command acts on, counted now, at most ``limit``. Each ``--id`` must name exactly one
    of them: a short prefix that catches several is refused (listing them), and one that names none is an
    error, as for ``cancel`` and ``inspect``."""
    found = pq.list(match, limit=None if ids else limit)
    for prefix in ids:
        hits = [p for p in found if p.parked_id.startswith(prefix)]
        if len(hits) > 1:
            raise _candidates(pq, prefix, hits, more=False)
        if not hits:
            among = f" matching {described}" if described != f"--id {prefix}" else ""
            raise click.ClickException(f"no parked message{among} in {pq.name!r} has an id starting with {prefix!r}; "
                                       "nothing was changed. `celery -A APP delayq parking list` shows the ids")
    return found[:limit] if limit else found


def _guard(task: str | None, exception: str | None, since: float | None, until: float | None,
           ids: tuple[str, ...], everything: bool, expect: int | None, dry_run: bool,
           yes: bool) -> tuple[str, int | None]:
    """Refuse an empty or unconfirmed selection before the queue is read.

    Returns the filter in words and the count the operator confirmed:
    ``--expect``, or, for ``--id`` alone (an exact selection), the number of
    ids, so that there ``--yes`` needs no ``--expect``.
    """
    described = _described(task, exception, since, until, ids)
    by_id = bool(ids) and not (task or exception or since is not None or until is not None)
    check_bulk(described=described, everything=everything, dry_run=dry_run, yes=yes and not by_id,
               expect=expect, noun="parked message")
    return described, (len(set(ids)) if by_id and expect is None else expect)


@click.group(name="parking")
def parking() -> None:
    """Messages whose retries were exhausted: list, inspect, replay, purge."""


@parking.command(name="list")
@_filter_options
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Show at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array ([] when nothing matches).")
@click.pass_context
def list_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
          since: float | None, until: float | None, ids: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List parked messages, oldest first. The queue is left as it was."""
    app = app_context(ctx)
    match = _match(task, exception, since, until, ids)
    with ParkingQueue.for_app(app.app, queue) as pq:
        exists = queue_exists(pq.connection, pq.name)
        found = pq.list(match, limit=limit) if exists else []
        total = pq.count() if exists else 0
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in found], indent=2, default=str))
        return
    if not exists:
        click.echo(f"no parking queue {pq.name!r} on {app.uri}: nothing has been parked yet")
        return
    if not found:
        if match.everything:
            click.echo(f"nothing is parked in {pq.name}")
        else:
            click.echo(f"no parked message in {pq.name} matches {_described(task, exception, since, until, ids)} "
                       f"({total} parked)")
        return
    table = Table(title=f"{pq.name}: {len(found)} shown of {total} parked", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", no_wrap=True)
    table.add_column("parked (UTC)", no_wrap=True)
    table.add_column("task / task id", overflow="fold")
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column("exception / reason", overflow="fold")
    for p in found:
        at = _when(p.parked_at).removesuffix(" UTC")
        table.add_row(p.parked_id[:12], at.replace(" ", "\n", 1) if at != "-" else at,
                      f"{escape(p.task)}\n[dim]{escape(p.task_id)}[/dim]", str(p.attempts),
                      f"[bold]{escape(p.exc_type.rsplit('.', 1)[-1])}[/bold] {escape(p.exc_message[:60])}\n"
                      f"[dim]{escape(p.reason)}[/dim]")
    console(ctx).print(table)


@parking.command(name="inspect")
@click.argument("parked_id", metavar="ID", type=Id("ID"))
@click.option("-q", "--queue", default=None, help="Parking queue (default: the app's delayq_parking_queue).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, with headers, properties and body.")
@click.pass_context
def inspect_(ctx: click.Context, parked_id: str, queue: str | None, as_json: bool) -> None:
    """Show one parked message: metadata, traceback, headers and body.

    ID is the parked id or the task id (`list` shows both), or the start of
    either; when it fits several messages they are listed.
    """
    with ParkingQueue.for_app(app_context(ctx).app, queue) as pq:
        found = pq.list(ParkedFilter(ids=(parked_id,), task_ids=(parked_id,)), limit=_CANDIDATES + 1)
    if not found:
        raise click.ClickException(f"no parked message in {pq.name!r} has a parked id or a task id starting with "
                                   f"{parked_id!r}; `celery -A APP delayq parking list` shows the ids")
    if len(found) > 1:
        raise _candidates(pq, parked_id, found, more=len(found) > _CANDIDATES)
    parked = found[0]
    if as_json:
        data = parked.to_dict(with_body=True)
        # The traceback is a key of its own; the same text as a header would print it twice.
        data["headers"] = {k: v for k, v in data["headers"].items() if k not in _SHOWN_HEADERS}
        click.echo(json.dumps(data, default=str, indent=2))
        return
    out, p = console(ctx), parked
    for label, value in (("parked id", p.parked_id), ("parked at", _when(p.parked_at)), ("reason", p.reason),
                         ("task", f"{p.task} [{p.task_id}]"),
                         ("attempts", f"{p.attempts} (first {_when(p.first_attempt)}, last {_when(p.last_attempt)})"),
                         ("exception", f"{p.exc_type}: {p.exc_message}"),
                         ("replays to", f"exchange {p.exchange!r}, routing key {p.routing_key!r}")):
        out.print(f"[bold]{label}:[/bold] {value}")
    out.print("[bold]traceback:[/bold]")
    out.print(p.traceback or "-", markup=False)
    out.print("[bold]headers:[/bold]")
    for key, value in sorted(p.headers.items()):
        if key not in _SHOWN_HEADERS:
            out.print(f"  {key}: {value!r}", markup=False)
    out.print("[bold]body:[/bold]")
    out.print(p.body.decode("utf-8", "replace"), markup=False)


def _dry_run(ctx: click.Context, pq: ParkingQueue, found: list[ParkedMessage], delay: float | None) -> None:
    out = console(ctx)
    routable = functools.cache(functools.partial(destination_exists, pq.connection))  # once per destination
    table = Table(title=f"dry run: {len(found)} of {pq.count()} parked message(s) in {pq.name} would be replayed",
                  title_justify="left")
    for column in ("id", "task", "task id", "attempts", "to", "destination"):
        table.add_column(column, overflow="fold")
    for p in found:
        to = f"queue {p.routing_key}" if not p.exchange else f"{p.exchange} / {p.routing_key}"
        table.add_row(p.parked_id[:12], p.task, p.task_id, str(p.attempts), to,
                      "exists" if routable(p.exchange, p.routing_key) else "[red]missing: would stay parked[/red]")
    out.print(table)
    stuck = sum(1 for p in found if not routable(p.exchange, p.routing_key))
    when = f"after {delay:g} s in the ladder" if delay else "at once"
    out.print(f"would replay {len(found) - stuck} {when}; {stuck} would stay parked (destination missing). "
              f"Nothing was changed.{_act_hint(len(found), 'replay')}")


def _confirmed(out: Console, pq: ParkingQueue, found: list[ParkedMessage], described: str, expect: int | None,
               yes: bool, *, ask: str, done: str, warning: str = "") -> list[str] | None:
    """The ids of ``found`` once the operator confirmed them (prompt, or ``--yes --expect N``); ``None`` when
    nothing matches and nothing was expected (said, as ``nothing <done>``)."""
    if not found and not expect:
        out.print(f"no parked message in {pq.name} matches {described or '--all'}; nothing {done}")
        return None
    confirm_bulk(f"{ask} {len(found)} parked message(s) of {pq.name!r} ({pq.count()} parked)?{warning}",
                 matched=len(found), expect=expect, yes=yes, noun="parked message")
    return [p.parked_id for p in found]


def _act_hint(count: int, verb: str) -> str:
    return f" To {verb} them: the same command with --yes --expect {count}." if count else ""


@parking.command(name="replay", cls=Action, action="parking-replay")
@_filter_options
@bulk_options("parked message")
@click.option("--delay", type=Delay(), default=None,
              help=Delay.help("Wait this long (in the ladder) before the replayed tasks run."))
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay at most this many.")
@click.option("--reset-attempts", is_flag=True, help="Start the tasks' retries over instead of one more attempt.")
@click.option("--batch-size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Messages per transaction.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed, and where to (the N of --expect N); "
                                              "change nothing.")
@yes_option
@click.pass_context
def replay_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
            since: float | None, until: float | None, ids: tuple[str, ...], everything: bool, expect: int | None,
            delay: float | None, limit: int | None, reset_attempts: bool, batch_size: int, dry_run: bool,
            yes: bool) -> None:
    """Replay parked messages to their original queue: filtered, by --id, or --all.

    Count first with --dry-run; then --yes --expect N replays when the
    selection still counts N. Interrupting a replay is safe: every message is
    either still parked or replayed once.
    """
    out = console(ctx)
    described, expect = _guard(task, exception, since, until, ids, everything, expect, dry_run, yes)
    with ParkingQueue.for_app(app_context(ctx).app, queue) as pq:
        found = _select(pq, _match(task, exception, since, until, ids), ids, described, limit)
        if dry_run:
            _dry_run(ctx, pq, found, delay)
            return
        chosen = _confirmed(out, pq, found, described, expect, yes, ask="Replay", done="replayed")
        if chosen is None:
            return
        with _bar("replaying", out) as bar:
            report = pq.replay(ParkedFilter(exactly=frozenset(chosen)), delay=delay, reset_attempts=reset_attempts,
                               batch_size=batch_size, progress=bar)
    audit_action(ctx, ids=chosen, queue=pq.name, filter=described or "--all", replayed=report.replayed,
                 unroutable=report.unroutable or None, delay=delay or None)
    out.print(f"replayed {report.replayed}; still parked: {report.skipped} not selected, "
              f"{report.unroutable} without a destination, {report.reparked} returned and parked again")


@parking.command(name="purge", cls=Action, action="parking-purge")
@_filter_options
@bulk_options("parked message")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted (the N of --expect N).")
@yes_option
@click.option("-f", "--force", is_flag=True, hidden=True, help="Old spelling of --yes.")
@click.pass_context
def purge_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
           since: float | None, until: float | None, ids: tuple[str, ...], everything: bool, expect: int | None,
           dry_run: bool, yes: bool, force: bool) -> None:
    """Delete parked messages: filtered, by --id, or --all. There is no undo.

    Count first with --dry-run; then --yes --expect N deletes when the
    selection still counts N.
    """
    out = console(ctx)
    yes = yes or force
    described, expect = _guard(task, exception, since, until, ids, everything, expect, dry_run, yes)
    with ParkingQueue.for_app(app_context(ctx).app, queue) as pq:
        found = _select(pq, _match(task, exception, since, until, ids), ids, described)
        if dry_run:
            out.print(f"dry run: {len(found)} of {pq.count()} parked message(s) in {pq.name} match "
                      f"{described or '--all'} and would be deleted. Nothing was changed."
                      f"{_act_hint(len(found), 'delete')}")
            return
        chosen = _confirmed(out, pq, found, described, expect, yes, ask="Delete", done="purged",
                            warning=" There is no undo")
        if chosen is None:
            return
        with _bar("purging", out) as bar:
            deleted = pq.purge(ParkedFilter(exactly=frozenset(chosen)), progress=bar)
    audit_action(ctx, ids=chosen, queue=pq.name, filter=described or "--all", deleted=deleted)
    out.print(f"purged {deleted} message(s) from {pq.name}")
