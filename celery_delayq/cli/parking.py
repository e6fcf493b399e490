"""``celery -A proj delayq parking ...``: list, inspect, replay and purge parked messages.

Works on the app's parking queue (``delayq_parking_queue``, else
``<delayq_prefix>.parking``) unless ``--queue`` names another one. Reading
commands leave the queue as it was; ``replay`` and ``purge`` ask first
(``--yes`` skips the question; a non-interactive shell must give it), and
``replay --dry-run`` shows what a replay would do without doing it.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import amqp
import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ..parking import ParkedFilter, ParkedMessage, ParkingQueue
from ..parking import record as R
from ..rabbitmq.context import AppContext
from .base import app_context, confirm, console, yes_option
from .when import Moment

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
        click.option("--id", "ids", multiple=True, help="Parked id, or enough of its start to be unique (repeatable)."),
    ]):
        command = option(command)
    return command


def _match(task: str | None, exception: str | None, since: float | None, until: float | None,
           ids: tuple[str, ...]) -> ParkedFilter:
    return ParkedFilter(task=task, exception=exception, ids=tuple(ids), since=since, until=until)


def _open(app: AppContext, queue: str | None) -> ParkingQueue:
    """The parking queue, without installing the ladder hook (only a delayed replay needs the ladder)."""
    def ladder() -> Any:
        from ..glue.integration import install

        return install(app.app).publisher

    return ParkingQueue(app.connection(), queue or app.parking_queue, ladder=ladder)


def _exists(pq: ParkingQueue, kind: str, name: str) -> bool:
    """Passive declare of a queue or exchange (the default exchange always exists)."""
    if kind == "exchange" and not name:
        return True
    ch = pq.connection.channel()
    try:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, "direct", passive=True)
        return True
    except amqp.NotFound:
        return False
    finally:
        with contextlib.suppress(Exception):
            if ch.is_open:
                ch.close()


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


def _destination(p: ParkedMessage) -> str:
    return f"queue {p.routing_key}" if not p.exchange else f"{p.exchange} / {p.routing_key}"


class _Bar:
    """A rich progress bar fed by ``(done, total)`` callbacks."""

    def __init__(self, label: str, out: Console) -> None:
        self.progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                 console=out, transient=True)
        self.task_id = self.progress.add_task(label, total=None)

    def __call__(self, done: int, total: int) -> None:
        self.progress.update(self.task_id, completed=done, total=total)

    def __enter__(self) -> "_Bar":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _candidates(pq: ParkingQueue, prefix: str, found: list[ParkedMessage], *, more: bool) -> click.ClickException:
    """The error for an id prefix that names more than one parked message, listing them."""
    lines = [f"{len(found)}{'+' if more else ''} parked messages in {pq.name!r} have an id starting with "
             f"{prefix!r}; give more of the id:"]
    for p in found[:_CANDIDATES]:
        lines.append(f"  {p.parked_id}  {_when(p.parked_at)}  {p.task} [{p.task_id}]  {p.exc_type.rsplit('.', 1)[-1]}")
    return click.ClickException("\n".join(lines))


def _check_ids_unique(pq: ParkingQueue, ids: tuple[str, ...], found: list[ParkedMessage]) -> None:
    """Each ``--id`` must name one message: a short prefix that catches several is refused."""
    for prefix in ids:
        hits = [p for p in found if p.parked_id.startswith(prefix)]
        if len(hits) > 1:
            raise _candidates(pq, prefix, hits, more=False)


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
    with _open(app, queue) as pq:
        exists = _exists(pq, "queue", pq.name)
        found = pq.list(_match(task, exception, since, until, ids), limit=limit) if exists else []
        total = pq.count() if exists else 0
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in found], indent=2, default=str))
        return
    if not exists:
        click.echo(f"no parking queue {pq.name!r} on {app.uri}: nothing has been parked yet")
        return
    match = _match(task, exception, since, until, ids)
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
@click.argument("parked_id", metavar="ID")
@click.option("-q", "--queue", default=None, help="Parking queue (default: the app's delayq_parking_queue).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, with headers, properties and body.")
@click.pass_context
def inspect_(ctx: click.Context, parked_id: str, queue: str | None, as_json: bool) -> None:
    """Show one parked message: metadata, traceback, headers and body.

    ID is the parked id or the task id (`list` shows both), or the start of
    either; when it fits several messages they are listed.
    """
    with _open(app_context(ctx), queue) as pq:
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
    _print_details(parked, console(ctx))


def _print_details(p: ParkedMessage, out: Console) -> None:
    for label, value in _details(p):
        out.print(f"[bold]{label}:[/bold] {value}")
    out.print("[bold]traceback:[/bold]")
    out.print(p.traceback or "-", markup=False)
    out.print("[bold]headers:[/bold]")
    for key, value in sorted(p.headers.items()):
        if key not in _SHOWN_HEADERS:
            out.print(f"  {key}: {value!r}", markup=False)
    out.print("[bold]body:[/bold]")
    out.print(p.body.decode("utf-8", "replace"), markup=False)


def _details(p: ParkedMessage) -> Iterator[tuple[str, str]]:
    yield "parked id", p.parked_id
    yield "parked at", _when(p.parked_at)
    yield "reason", p.reason
    yield "task", f"{p.task} [{p.task_id}]"
    yield "attempts", f"{p.attempts} (first {_when(p.first_attempt)}, last {_when(p.last_attempt)})"
    yield "exception", f"{p.exc_type}: {p.exc_message}"
    yield "replays to", f"exchange {p.exchange!r}, routing key {p.routing_key!r}"


def _dry_run(ctx: click.Context, pq: ParkingQueue, found: list[ParkedMessage], delay: float | None) -> None:
    out = console(ctx)
    routable: dict[tuple[str, str], bool] = {}
    for p in found:
        key = (p.exchange, p.routing_key)
        if key not in routable:
            routable[key] = _exists(pq, "queue", p.routing_key) if not p.exchange else _exists(pq, "exchange", p.exchange)
    table = Table(title=f"dry run: {len(found)} of {pq.count()} parked message(s) in {pq.name} would be replayed",
                  title_justify="left")
    for column in ("id", "task", "task id", "attempts", "to", "destination"):
        table.add_column(column, overflow="fold")
    for p in found:
        ok = routable[(p.exchange, p.routing_key)]
        table.add_row(p.parked_id[:12], p.task, p.task_id, str(p.attempts), _destination(p),
                      "exists" if ok else "[red]missing: would stay parked[/red]")
    out.print(table)
    stuck = sum(1 for p in found if not routable[(p.exchange, p.routing_key)])
    when = f"after {delay:g} s in the ladder" if delay else "at once"
    out.print(f"would replay {len(found) - stuck} {when}; {stuck} would stay parked (destination missing). "
              "Nothing was changed.")


@parking.command(name="replay")
@_filter_options
@click.option("--delay", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait (in the ladder) before the replayed tasks run.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay at most this many.")
@click.option("--reset-attempts", is_flag=True, help="Start the tasks' retries over instead of one more attempt.")
@click.option("--batch-size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Messages per transaction.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed, and where to; change nothing.")
@yes_option
@click.pass_context
def replay_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
            since: float | None, until: float | None, ids: tuple[str, ...], delay: float | None,
            limit: int | None, reset_attempts: bool, batch_size: int, dry_run: bool, yes: bool) -> None:
    """Replay parked messages to their original queue, all or filtered.

    Interrupting a replay is safe: every message is either still parked or replayed once.
    """
    out = console(ctx)
    match = _match(task, exception, since, until, ids)
    with _open(app_context(ctx), queue) as pq:
        found: list[ParkedMessage] | None = None
        if dry_run or ids or not (yes or match.everything):
            found = pq.list(match, limit=None if ids else limit)
            _check_ids_unique(pq, ids, found)
            found = found[:limit] if limit else found
        if dry_run:
            assert found is not None
            _dry_run(ctx, pq, found, delay)
            return
        if found is not None and not found:
            out.print(f"no parked message in {pq.name} matches; nothing replayed")
            return
        what = f"{len(found)} matching message(s)" if found is not None else "ALL messages"
        confirm(f"Replay {what} of {pq.name!r} ({pq.count()} parked)?", yes)
        with _Bar("replaying", out) as bar:
            report = pq.replay(match, delay=delay, limit=limit, reset_attempts=reset_attempts,
                               batch_size=batch_size, progress=bar)
    out.print(f"replayed {report.replayed}; still parked: {report.skipped} not selected, "
              f"{report.unroutable} without a destination, {report.reparked} returned and parked again")


@parking.command(name="purge")
@_filter_options
@yes_option
@click.option("-f", "--force", is_flag=True, hidden=True, help="Old spelling of --yes.")
@click.pass_context
def purge_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
           since: float | None, until: float | None, ids: tuple[str, ...], yes: bool, force: bool) -> None:
    """Delete parked messages, all or filtered. There is no undo."""
    match = _match(task, exception, since, until, ids)
    out = console(ctx)
    with _open(app_context(ctx), queue) as pq:
        if ids or not (yes or force or match.everything):
            found = pq.list(match)
            _check_ids_unique(pq, ids, found)
            if not found:
                out.print(f"no parked message in {pq.name} matches; nothing purged")
                return
            what = f"{len(found)} matching message(s)"
        else:
            what = "ALL messages"
        confirm(f"Delete {what} of {pq.name!r} ({pq.count()} parked)? There is no undo", yes or force)
        with _Bar("purging", out) as bar:
            deleted = pq.purge(match, progress=bar)
    out.print(f"purged {deleted} message(s) from {pq.name}")
