"""``delayq topology declare|verify|delete``: the ladder's exchanges and queues on the broker.

``verify`` only looks (passive declares); ``delete`` deletes only what is
there, and asks first.
"""

from __future__ import annotations


import amqp
import click

from ..ladder.humanize import describe_ladder
from ..rabbitmq.topology import Destination, Topology
from ..rabbitmq.fixed import fixed_queue_prefix
from ..rabbitmq.management import ManagementAPI
from ..rabbitmq.context import AppContext
from .base import app_context, confirm, yes_option
from ..typing import CeleryApp

__all__ = ["topology", "no_ladder", "parse_destinations"]

_DESTINATION_HELP = "EXCHANGE:ROUTING_KEY|QUEUE"


def parse_destinations(topo: Topology, values: tuple[str, ...] | list[str]) -> list[Destination]:
    """``EXCHANGE:ROUTING_KEY`` or a bare queue name (the default exchange) per value."""
    dests = []
    for value in values:
        exchange, sep, routing_key = value.partition(":")
        if not sep:
            exchange, routing_key = "", value
        dests.append(topo.destination(exchange, routing_key))
    return dests


def no_ladder(app: AppContext, raw: amqp.Connection) -> str:
    """Why there is nothing to show: no ladder of this name and shape, and what to check."""
    spec = app.spec
    text = f"no ladder named {spec.prefix!r} ({spec.namespace}) on {app.uri}; nothing was created."
    ch = raw.channel()
    try:
        ch.exchange_declare(spec.unroutable_exchange, "fanout", passive=True)
        other_shape = True
    except amqp.NotFound:
        other_shape = False
    finally:
        if ch.is_open:
            ch.close()
    if other_shape:
        return (f"{text} A ladder with prefix {spec.prefix!r} exists in another shape: this app expects "
                f"{spec.levels} levels of radix {spec.radix}; check delayq_levels and delayq_radix.")
    return f"{text} Check delayq_prefix, or create it with `celery -A APP delayq topology declare`."


def _app_destinations(app: CeleryApp) -> list[str]:
    """Where the app's own publishes go: each configured queue's exchange and routing key, and the queue."""
    values: list[str] = []
    for queue in app.amqp.queues.values():
        exchange = queue.exchange.name if queue.exchange is not None else ""
        values.append(f"{exchange}:{queue.routing_key or queue.name}")
        values.append(queue.name)
    return values


def _fixed_queues(api: ManagementAPI | None, prefix: str) -> list[str]:
    """The ``fixed`` backend's queues of ``prefix`` (their names hold a delay: only the API can list them)."""
    found = api.queues() if api is not None else None
    start = fixed_queue_prefix(prefix)
    return sorted(str(q["name"]) for q in found or () if str(q.get("name", "")).startswith(start))


@click.group()
def topology() -> None:
    """Declare, verify or delete the ladder on the broker."""


@topology.command()
@click.option("--destination", "-d", multiple=True, metavar=_DESTINATION_HELP,
              help="Also create the exit queue of a destination (repeatable).")
@click.pass_context
def declare(ctx: click.Context, destination: tuple[str, ...]) -> None:
    """Create the ladder (idempotent)."""
    app = app_context(ctx)
    with app.connected() as raw:
        topo = app.topology(raw)
        topo.declare(raw)
        for dest in parse_destinations(topo, destination):
            topo.ensure_exit(raw, dest, declare=True)
    click.echo(f"declared {describe_ladder(topo.spec, topo.queue_type)} on {app.uri}")
    unchecked = getattr(topo.budget, "unchecked", None)
    if unchecked:
        click.echo(f"note: the new ladder's {unchecked[1]} quorum queues reserve {unchecked[1] * 3}+ file handles on "
                   "RabbitMQ 3.x, and its budget could not be checked (no management API): check it with "
                   "`rabbitmqctl eval 'file_handle_cache:info().'` (total_used must stay well below total_limit).",
                   err=True)


@topology.command()
@click.pass_context
def verify(ctx: click.Context) -> None:
    """Check that the ladder exists with the expected arguments. Creates nothing."""
    app = app_context(ctx)
    with app.connected() as raw:
        topo = app.topology(raw)
        if not topo.inspect(raw).exists:
            raise click.ClickException(no_ladder(app, raw))
        topo.verify(raw)
        leaders = _leaders_warning(app, raw)
    click.echo(f"{describe_ladder(topo.spec, topo.queue_type)} is complete on {app.uri} "
               "and matches the settings")
    if leaders:
        click.echo(f"warning: {leaders}", err=True)


def _leaders_warning(app: AppContext, raw: amqp.Connection) -> str | None:
    """On a multi-node cluster: why and how to spread a ladder whose leaders are not (``None``: fine or unknown)."""
    from ..doctor.checks import leaders_finding
    from ..doctor.finding import WARN, ApiReach

    api = app.api(raw)
    if api is None:
        return None
    names = [q.name for q in app.spec.level_queues()]
    rows, nodes = api.queues(names), api.running_nodes()
    if rows is None or nodes is None or len(nodes) < 2:
        return None
    found = leaders_finding(rows, nodes, names, ApiReach(api.base_url, "ok"),
                            vhost=api.vhost, namespace=app.spec.namespace)
    return f"{found.summary} {found.next_step}" if found.status == WARN else None


@topology.command()
@click.option("--held-for", default=2.0, show_default=True, metavar="SECONDS",
              help="How long a queue must keep holding messages to count as stuck.")
@click.pass_context
def recover(ctx: click.Context, held_for: float) -> None:
    """Set moving ladder queues that hold messages after a broker restart (RabbitMQ < 4.3).

    Looks for queues of the ladder whose messages stay in the dead-letter state
    (messages > ready + unacked), and if there are any, sets and deletes a
    short-lived policy on them: each queue's dead-letter worker then finds its
    targets again at once instead of after RabbitMQ's 180 s retry. Workers do
    this themselves when their connection comes back; this is the operator's
    way. Needs the management API and a user that may set policies.
    """
    from ..rabbitmq.recovery import Recovery

    app = app_context(ctx)
    with app.connected() as raw:
        api = app.api(raw)
    if api is None or not api.same_broker:
        raise click.ClickException("cannot look for held messages: RabbitMQ's management API is not "
                                   "reachable (set delayq_management_url)")
    recovery = Recovery(api, app.spec.prefix)
    stuck = recovery.stuck(held_for=held_for)
    if stuck is None:
        raise click.ClickException(f"the management API at {api.base_url} did not list the queues")
    if not stuck:
        click.echo(f"no ladder queue of {app.spec.prefix!r} holds messages on {app.uri}: nothing to do")
        return
    if not recovery.touch():
        raise click.ClickException(f"{sum(stuck.values())} message(s) are held in {len(stuck)} queue(s), and "
                                   "the broker refused the policy that moves them: the management user needs "
                                   "the 'policymaker' (or 'administrator') tag")
    still = recovery.still_held(stuck)
    moved = {name: n for name, n in stuck.items() if name not in still}
    if moved:
        shown = ", ".join(f"{name} ({n})" for name, n in sorted(moved.items()))
        click.echo(f"{sum(moved.values())} held message(s) in {len(moved)} queue(s) set moving: {shown}")
    if still:
        shown = ", ".join(f"{name} ({n})" for name, n in sorted(still.items()))
        click.echo(f"{sum(still.values())} message(s) still held after the policy touch: {shown}. In an exit "
                   "queue (<prefix>.exit.*) that means its destination cannot take them (deleted, or no "
                   "binding): restore it. In a level queue, a dead-letter worker holds what a target queue "
                   "rejected or did not confirm while a node was down, and re-sends it only once "
                   "dead_letter_worker_publisher_confirm_timeout has passed (180 s unless advanced.config lowers "
                   "it; no policy change shortens that): they are late, not lost. `delayq doctor` names the "
                   "setting.")


@topology.command()
@click.option("--discard-messages", is_flag=True,
              help="Delete even queues that still hold delayed messages (they are lost).")
@click.option("--destination", "-d", multiple=True, metavar=_DESTINATION_HELP,
              help="Also delete the exit queue of this destination (repeatable). The exit queues of the "
                   "app's configured task queues are always included.")
@click.option("--keep-shared", is_flag=True,
              help="Keep what every shape (levels, radix) of the prefix shares: <prefix>.unroutable and the exit "
                   "queues. Use it to delete an old shape while a reshaped ladder of the same prefix stays in use.")
@yes_option
@click.pass_context
def delete(ctx: click.Context, discard_messages: bool, destination: tuple[str, ...], keep_shared: bool,
           yes: bool) -> None:
    """Delete the ladder and its exit queues. Refuses while messages wait in them.

    AMQP cannot list queues, so the exit queues deleted are those of the app's
    configured queues plus every ``--destination`` given; the ``fixed`` backend's
    queues (``<prefix>.fixed.*``) are found through the management API, when it
    answers, and deleted with them. The parking queue is kept.
    """
    app = app_context(ctx)
    with app.connected() as raw:
        topo = app.topology(raw)
        exits = [] if keep_shared else [
            d.exit_queue for d in parse_destinations(topo, (*_app_destinations(app.app), *destination))]
        exits += [] if keep_shared else _fixed_queues(app.api(raw), topo.spec.prefix)
        state = topo.inspect(raw, extra_queues=exits)
        if not state.exists:
            kept = ""
            if state.queue(topo.spec.unroutable_queue).exists:
                kept = (f"; {topo.spec.unroutable_queue} is kept: a ladder of another shape (delayq_levels, "
                        "delayq_radix) shares it")
            click.echo(f"no ladder named {topo.spec.prefix!r} ({topo.spec.namespace}) on {app.uri}: "
                       f"nothing to delete{kept}")
            return
        shared = {topo.spec.unroutable_queue, topo.spec.unroutable_exchange}
        present = [e for e in state.entities if e.exists and not (keep_shared and e.name in shared)]
        queues = {e.name: e for e in present if e.kind == "queue"}
        busy = [e for e in queues.values() if e.messages]
        held = sum(e.messages or 0 for e in busy)
        if busy and not discard_messages:
            names = ", ".join(f"{e.name} ({e.messages})" for e in busy[:5]) + (" ..." if len(busy) > 5 else "")
            raise click.ClickException(
                f"{held} message(s) still wait in {len(busy)} queue(s) of ladder {topo.spec.prefix!r}: "
                f"{names}. Nothing was deleted. Wait until they are delivered, or add --discard-messages "
                "to drop them.")
        lost = f", dropping the {held} message(s) they hold" if held else ""
        confirm(f"Delete ladder {topo.spec.prefix!r} on {app.uri}: {len(present) - len(queues)} exchanges "
                f"and {len(queues)} queues{lost}?", yes)
        deleted = topo.delete(raw, if_empty=not discard_messages, exit_queues=exits, keep_shared=keep_shared)
    n_exchanges = sum(1 for d in deleted if d.startswith("exchange "))
    n_exits = len({f"queue {name}" for name in exits} & set(deleted))
    click.echo(f"deleted ladder {topo.spec.prefix!r} on {app.uri}: {n_exchanges} exchanges, "
               f"{len(deleted) - n_exchanges} queues ({n_exits} of them exit queues)")
