"""``delayq export``: the ladder as RabbitMQ definitions or Terraform, for platform tooling. No broker needed."""

from __future__ import annotations

import click

from ..ladder.index_layout import index_layout
from ..rabbitmq.topology import Topology, resolve_queue_type
from ..rabbitmq.client import broker_version
from ..glue.app_ladder import AppLadder
from .base import app_context
from .topology import parse_destinations

__all__ = ["export"]


@click.command()
@click.option("--format", "fmt", type=click.Choice(["definitions", "terraform"]), default="definitions",
              show_default=True)
@click.option("--vhost", default=None, help="vhost to put in the output (default: the app's).")
@click.option("--destination", "-d", multiple=True, metavar="EXCHANGE:ROUTING_KEY|QUEUE",
              help="Include the exit queue of a destination (repeatable).")
@click.option("--broker-version", default=None, metavar="X.Y[.Z]",
              help="RabbitMQ version the output is for (the parking queue's arguments depend on it). "
                   "Default: ask the app's broker; if it cannot be reached, those of 3.x.")
@click.pass_context
def export(ctx: click.Context, fmt: str, vhost: str | None, destination: tuple[str, ...],
           broker_version: str | None) -> None:
    """Print the ladder as RabbitMQ definitions JSON or Terraform, for platform tooling."""
    from ..rabbitmq import export as exporters

    app = app_context(ctx)
    requested = app.config.queue_type
    # No broker to ask: "auto" means quorum, which every supported broker (3.10+) has.
    topo = Topology(app.config.spec, "quorum" if requested == "auto" else resolve_queue_type(requested, (99,)))
    dests = parse_destinations(topo, destination)
    vhost = vhost or app.connection().virtual_host or "/"
    render = exporters.definitions if fmt == "definitions" else exporters.terraform
    target = _target_version(app, broker_version)
    # The streams of the index and the cancel log are part of the ladder (RabbitMQ 3.9+).
    topo.index = index_layout(app.config.spec, index=app.config.index, version=target or (3, 10))
    parking = exporters.parking_queue_def(app.config, topo.queue_type, target)
    click.echo(render(topo, vhost=vhost, exits=dests, parking=parking))


def _target_version(app: AppLadder, given: str | None) -> tuple[int, ...] | None:
    if given:
        try:
            return tuple(int(part) for part in given.split("."))
        except ValueError:
            raise click.BadParameter(f"{given!r} is not a version such as 4.3 or 3.10.8",
                                     param_hint="--broker-version") from None
    try:
        with app.connected() as raw:
            return broker_version(raw)
    except Exception as exc:  # an export must work without a broker: say what it assumed
        click.echo(f"delayq export: could not ask the broker for its version ({exc}); the parking queue "
                   "gets 3.x arguments. Pass --broker-version for a 4.x broker.", err=True)
        return None
