"""``celery -A proj delayq parking ...``: list, inspect, replay and purge parked messages.

The group reads the Celery app from Celery's CLI context (``ctx.obj.app``),
like Celery's own commands, and works on the app's parking queue
(``delayq_parking_queue``) unless ``--queue`` names another one.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ..parking import ParkedFilter, ParkedMessage, ParkedMessageNotFound, ParkingQueue

__all__ = ["parking"]

_DATETIME = click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S",
                                    "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z"])


def _filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options every sub-command shares: which queue, and which of its messages."""
    for option in reversed([
        click.option("-q", "--queue", default=None, help="Parking queue (default: the app's delayq_parking_queue)."),
        click.option("--task", default=None, help="Only tasks whose name matches this glob."),
        click.option("--exception", default=None, help="Only exceptions whose type matches this glob."),
        click.option("--since", type=_DATETIME, default=None, help="Parked at or after (local time unless offset given)."),
        click.option("--until", type=_DATETIME, default=None, help="Parked before (local time unless offset given)."),
        click.option("--id", "ids", multiple=True, help="Parked-id prefix (repeatable)."),
    ]):
        command = option(command)
    return command


def _match(task: str | None, exception: str | None, since: datetime | None, until: datetime | None,
           ids: tuple[str, ...]) -> ParkedFilter:
    return ParkedFilter(task=task, exception=exception, ids=tuple(ids),
                        since=since.timestamp() if since else None, until=until.timestamp() if until else None)


def _open(ctx: click.Context, queue: str | None) -> ParkingQueue:
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run as `celery -A proj delayq parking ...`")
    return ParkingQueue.for_app(app, queue)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _console() -> Console:
    return Console(soft_wrap=True, highlight=False)


class _Bar:
    """A rich progress bar fed by ``(done, total)`` callbacks."""

    def __init__(self, label: str, console: Console) -> None:
        self.progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                 console=console, transient=True)
        self.task_id = self.progress.add_task(label, total=None)

    def __call__(self, done: int, total: int) -> None:
        self.progress.update(self.task_id, completed=done, total=total)

    def __enter__(self) -> "_Bar":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


@click.group(name="parking")
def parking() -> None:
    """Messages whose retries were exhausted: list, inspect, replay, purge."""


@parking.command(name="list")
@_filter_options
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Show at most this many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def list_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
          since: datetime | None, until: datetime | None, ids: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List parked messages, oldest first. The queue is left as it was."""
    with _open(ctx, queue) as pq:
        found = pq.list(_match(task, exception, since, until, ids), limit=limit)
        total = pq.count()
    if as_json:
        for parked in found:
            click.echo(json.dumps(parked.to_dict(), default=str))
        return
    table = Table(title=f"{pq.name}: {len(found)} shown of {total} parked")
    for column in ("id", "parked at", "task", "task id", "attempts", "exception", "message", "reason"):
        table.add_column(column, overflow="fold")
    for p in found:
        table.add_row(p.parked_id[:12], _when(p.parked_at), p.task, p.task_id, str(p.attempts),
                      p.exc_type.rsplit(".", 1)[-1], p.exc_message[:60], p.reason)
    _console().print(table)


@parking.command(name="inspect")
@click.argument("parked_id")
@click.option("-q", "--queue", default=None, help="Parking queue (default: the app's delayq_parking_queue).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, with headers, properties and body.")
@click.pass_context
def inspect_(ctx: click.Context, parked_id: str, queue: str | None, as_json: bool) -> None:
    """Show one parked message: metadata, traceback, headers and body."""
    with _open(ctx, queue) as pq:
        try:
            parked = pq.get(parked_id)
        except ParkedMessageNotFound as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(parked.to_dict(with_body=True), default=str, indent=2))
        return
    _print_details(parked, _console())


def _print_details(p: ParkedMessage, console: Console) -> None:
    for label, value in _details(p):
        console.print(f"[bold]{label}:[/bold] {value}")
    console.print("[bold]traceback:[/bold]")
    console.print(p.traceback or "-", markup=False)
    console.print("[bold]headers:[/bold]")
    for key, value in sorted(p.headers.items()):
        console.print(f"  {key}: {value!r}", markup=False)
    console.print("[bold]body:[/bold]")
    console.print(p.body.decode("utf-8", "replace"), markup=False)


def _details(p: ParkedMessage) -> Iterator[tuple[str, str]]:
    yield "parked id", p.parked_id
    yield "parked at", _when(p.parked_at)
    yield "reason", p.reason
    yield "task", f"{p.task} [{p.task_id}]"
    yield "attempts", f"{p.attempts} (first {_when(p.first_attempt)}, last {_when(p.last_attempt)})"
    yield "exception", f"{p.exc_type}: {p.exc_message}"
    yield "replays to", f"exchange {p.exchange!r}, routing key {p.routing_key!r}"


@parking.command(name="replay")
@_filter_options
@click.option("--delay", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait (in the ladder) before the replayed tasks run.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay at most this many.")
@click.option("--reset-attempts", is_flag=True, help="Start the tasks' retries over instead of one more attempt.")
@click.option("--batch-size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Messages per transaction.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def replay_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
            since: datetime | None, until: datetime | None, ids: tuple[str, ...], delay: float | None,
            limit: int | None, reset_attempts: bool, batch_size: int, yes: bool) -> None:
    """Replay parked messages to their original queue, all or filtered.

    Interrupting a replay is safe: every message is either still parked or replayed once.
    """
    console = _console()
    with _open(ctx, queue) as pq:
        if not yes:
            click.confirm(f"Replay matching messages of {pq.name!r} ({pq.count()} parked)?", abort=True)
        with _Bar("replaying", console) as bar:
            report = pq.replay(_match(task, exception, since, until, ids), delay=delay, limit=limit,
                               reset_attempts=reset_attempts, batch_size=batch_size, progress=bar)
    console.print(f"replayed {report.replayed}; still parked: {report.skipped} not selected, "
                  f"{report.unroutable} without a destination, {report.reparked} returned and parked again")


@parking.command(name="purge")
@_filter_options
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def purge_(ctx: click.Context, queue: str | None, task: str | None, exception: str | None,
           since: datetime | None, until: datetime | None, ids: tuple[str, ...], force: bool) -> None:
    """Delete parked messages, all or filtered. There is no undo."""
    match = _match(task, exception, since, until, ids)
    console = _console()
    with _open(ctx, queue) as pq:
        if not force:
            what = "ALL messages" if match.everything else "the matching messages"
            click.confirm(f"Delete {what} of {pq.name!r} ({pq.count()} parked)? There is no undo", abort=True)
        with _Bar("purging", console) as bar:
            deleted = pq.purge(match, progress=bar)
    console.print(f"purged {deleted} message(s) from {pq.name}")
