"""Topology, status and export commands."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import click
from rich.console import Console
from rich.table import Table

from ..errors import DelayqError
from ..integration import install
from ..occupancy import ladder_occupancy
from ..topology import Topology

__all__ = ["topology", "status", "export"]


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """Show our specific errors as clean CLI errors (their messages say what to do)."""
    try:
        yield
    except DelayqError as exc:
        raise click.ClickException(str(exc)) from None


def _router(ctx: click.Context) -> Any:
    app = ctx.obj.app if ctx.obj is not None and hasattr(ctx.obj, "app") else None
    if app is None:
        raise click.UsageError("run as `celery -A YOUR_APP delayq ...` so the app's settings are known")
    return install(app)


def _destinations(router: Any, values: tuple[str, ...]) -> list[Any]:
    dests = []
    topo: Topology = router.publisher.topology or router.publisher.declare()
    for value in values:
        exchange, sep, routing_key = value.partition(":")
        if not sep:
            exchange, routing_key = "", value  # a bare name is a queue
        dests.append(topo.destination(exchange, routing_key))
    return dests


@click.group()
def topology() -> None:
    """Declare, verify or delete the ladder on the broker."""


@topology.command()
@click.option("--destination", "-d", multiple=True, metavar="EXCHANGE:ROUTING_KEY|QUEUE",
              help="Also create the exit queue of a destination (repeatable).")
@click.pass_context
def declare(ctx: click.Context, destination: tuple[str, ...]) -> None:
    """Create the ladder (idempotent)."""
    router = _router(ctx)
    pub = router.publisher
    with _reported():
        topo = pub.declare()
        for dest in _destinations(router, destination):
            topo.ensure_exit(pub.raw_connection(), dest, declare=True)
    click.echo(f"ladder {topo.spec.prefix!r} declared: {topo.spec.levels} levels, {topo.queue_type} queues, "
               f"max delay {topo.spec.max_delay_s:.0f} s")


@topology.command()
@click.pass_context
def verify(ctx: click.Context) -> None:
    """Check the ladder exists with the expected arguments; creates nothing."""
    router = _router(ctx)
    from ..topology import broker_version, resolve_queue_type

    conn = router.connection()
    try:
        with _reported():
            conn.connect()
            raw = conn.connection
            topo = Topology(router.config.spec, resolve_queue_type(router.config.queue_type, broker_version(raw)))
            topo.verify(raw)
    finally:
        conn.release()
    click.echo(f"ladder {router.config.prefix!r} is complete and matches the settings")


def _app_destinations(router: Any) -> list[str]:
    """Where the app's own publishes go: each configured queue's exchange and routing key, and the queue itself."""
    values: list[str] = []
    for queue in router.app.amqp.queues.values():
        exchange = queue.exchange.name if queue.exchange is not None else ""
        values.append(f"{exchange}:{queue.routing_key or queue.name}")
        values.append(queue.name)
    return values


@topology.command()
@click.option("--force", is_flag=True, help="Delete queues even if they still hold delayed messages.")
@click.option("--destination", "-d", multiple=True, metavar="EXCHANGE:ROUTING_KEY|QUEUE",
              help="Also delete the exit queue of this destination (repeatable). The exit queues of the "
                   "app's configured task queues are always included.")
@click.pass_context
def delete(ctx: click.Context, force: bool, destination: tuple[str, ...]) -> None:
    """Delete the ladder and its exit queues (refuses while messages wait in them, unless --force).

    AMQP cannot list queues, so the exit queues deleted are those of the app's
    configured queues plus every ``--destination`` given.
    """
    router = _router(ctx)
    pub = router.publisher
    try:
        with _reported():
            topo = pub.declare()
            exits = [d.exit_queue for d in _destinations(router, (*_app_destinations(router), *destination))]
            deleted = topo.delete(pub.raw_connection(), if_empty=not force, exit_queues=exits)
    finally:
        pub.close()
    removed_exits = len({f"queue {name}" for name in exits} & set(deleted))
    click.echo(f"deleted {len(deleted)} ladder objects, {removed_exits} of them exit queues")


@click.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """Show how many messages wait in each ladder level."""
    router = _router(ctx)
    pub = router.publisher
    occ = ladder_occupancy(pub.raw_connection(), router.config.spec)
    table = Table(title=f"delayq ladder {router.config.prefix!r}")
    table.add_column("queue")
    table.add_column("waits", justify="right")
    table.add_column("messages", justify="right")
    for row in occ:
        table.add_row(row.queue, f"{row.ttl_ms / 1000:g} s", str(row.messages))
    Console().print(table)


@click.command()
@click.option("--format", "fmt", type=click.Choice(["definitions", "terraform"]), default="definitions",
              show_default=True)
@click.option("--vhost", default=None, help="vhost to put in the output (default: the app's).")
@click.option("--destination", "-d", multiple=True, metavar="EXCHANGE:ROUTING_KEY|QUEUE",
              help="Include the exit queue of a destination (repeatable).")
@click.pass_context
def export(ctx: click.Context, fmt: str, vhost: str | None, destination: tuple[str, ...]) -> None:
    """Print the ladder as RabbitMQ definitions JSON or Terraform, for platform tooling."""
    from .. import export as exporters
    from ..topology import resolve_queue_type

    router = _router(ctx)
    requested = router.config.queue_type
    topo = Topology(router.config.spec, "quorum" if requested == "auto" else resolve_queue_type(requested, (99,)))
    dests = []
    for value in destination:
        exchange, sep, routing_key = value.partition(":")
        dests.append(topo.destination(exchange if sep else "", routing_key if sep else value))
    vhost = vhost or router.connection().virtual_host or "/"
    render = exporters.definitions if fmt == "definitions" else exporters.terraform
    click.echo(render(topo, vhost=vhost, exits=dests))
