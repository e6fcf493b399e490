"""``delayq topology declare|verify|recover|delete``: the ladder's exchanges and queues on the broker.

``verify`` only looks; ``delete`` asks first and deletes what the broker's own listing (its management API)
shows the prefix made, whatever made it. Bad input is refused before anything is changed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from typing import Any, Sequence

import click

from ..config import CONVERTERS
from ..errors import InvalidName, SettingsError
from ..inputs import BadInput, check_id, ID_MAX
from ..ladder.humanize import describe_ladder
from ..rabbitmq.topology import Destination, Owned, OwnedSelection, ROLES, Topology, select_owned
from ..rabbitmq.client import Connection
from ..rabbitmq.management import ManagementAPI
from ..rabbitmq.probe import exchange_exists
from ..glue.app_ladder import AppLadder
from .base import Action, app_context, audit_action, confirm, yes_option

__all__ = ["topology", "no_ladder", "parse_destinations", "destination_parts"]

_DESTINATION_HELP = "EXCHANGE:ROUTING_KEY|QUEUE"
_DESTINATION_FORMS = "EXCHANGE:ROUTING_KEY (an exchange and a routing key) or QUEUE (a queue name)"
#: The longest ``recover --held-for`` (s): a look that long is a typo, and the command sleeps through it.
HELD_FOR_MAX_S = 600.0


def destination_parts(value: str) -> tuple[str, str]:
    """``(exchange, routing key)`` of one ``--destination``: ``EXCHANGE:ROUTING_KEY`` or a bare queue name.

    Raises:
        BadInput: empty, or no queue on the default exchange (``""``, ``":"``), or not printable
            UTF-8 text (a control character, a command line's ``$'\\xff'``); nothing is changed.
    """
    exchange, sep, routing_key = value.partition(":")
    if not sep:
        exchange, routing_key = "", value
    if not exchange and not routing_key.strip():
        raise BadInput(f"--destination: {value!r} names no queue; give {_DESTINATION_FORMS}")
    for part in (exchange, routing_key):
        if part:  # printable UTF-8 (its length in bytes is check_name's, in Topology.destination)
            try:
                check_id(part[:ID_MAX], what="--destination")
            except BadInput as exc:
                raise BadInput(f"{exc}; give {_DESTINATION_FORMS}") from None
    return exchange, routing_key


def parse_destinations(topo: Topology, values: tuple[str, ...] | list[str]) -> list[Destination]:
    """The :class:`Destination` of each ``--destination`` value (:func:`destination_parts`).

    Raises:
        BadInput: a value that names no destination, or a name RabbitMQ would refuse (over 255 bytes).
    """
    dests = []
    for value in values:
        exchange, routing_key = destination_parts(value)
        try:
            dests.append(topo.destination(exchange, routing_key))
        except InvalidName as exc:
            raise BadInput(f"--destination: {exc}") from None
    return dests


def no_ladder(app: AppLadder, raw: Connection) -> str:
    """Why there is nothing to show: no ladder of this name and shape, and what to check."""
    spec = app.config.spec
    text = f"no ladder named {spec.prefix!r} ({spec.namespace}) on {app.uri}; nothing was created."
    if exchange_exists(raw, spec.unroutable_exchange):
        return (f"{text} A ladder with prefix {spec.prefix!r} exists in another shape: this app expects "
                f"{spec.levels} levels of radix {spec.radix}; check delayq_levels and delayq_radix.")
    return f"{text} Check delayq_prefix, or create it with `celery -A APP delayq topology declare`."


@click.group()
def topology() -> None:
    """Declare, verify or delete the ladder on the broker."""


@topology.command(cls=Action, action="topology-declare")
@click.option("--destination", "-d", multiple=True, metavar=_DESTINATION_HELP,
              help="Also create the exit queue of a destination (repeatable): EXCHANGE:ROUTING_KEY, or a queue "
                   "name for the default exchange.")
@click.pass_context
def declare(ctx: click.Context, destination: tuple[str, ...]) -> None:
    """Create the ladder (idempotent)."""
    app = app_context(ctx)
    with app.connected() as raw:
        topo = app.topology(raw)
        dests = parse_destinations(topo, destination)  # bad input is refused before anything is created
        topo.declare(raw)
        for dest in dests:
            topo.ensure_exit(raw, dest, declare=True)
    audit_action(ctx, prefix=topo.spec.prefix, destinations=len(dests))
    click.echo(f"declared {describe_ladder(topo.spec, topo.queue_type)} on {app.uri}")
    if unchecked := getattr(topo.budget, "unchecked", None):
        click.echo(f"note: the new ladder's {unchecked[1]} quorum queues reserve {unchecked[1] * 3}+ file handles on "
                   "RabbitMQ 3.x, and its budget could not be checked (no management API): check it with "
                   "`rabbitmqctl eval 'file_handle_cache:info().'` (total_used must stay well below total_limit).",
                   err=True)


@topology.command()
@click.pass_context
def verify(ctx: click.Context) -> None:
    """Check that the ladder exists with the expected arguments. Creates nothing."""
    from ..doctor.checks import leaders_finding
    from ..doctor.finding import WARN, ApiReach

    app = app_context(ctx)
    names = [q.name for q in app.config.spec.level_queues()]
    with app.connected() as raw:
        topo = app.topology(raw)
        if not topo.inspect(raw).exists:
            raise click.ClickException(no_ladder(app, raw))
        entries = topo.verify(raw)
        api = app.api(raw)
        rows, nodes = (api.queues(names), api.running_nodes()) if api is not None else (None, None)
    click.echo(f"{describe_ladder(topo.spec, topo.queue_type)} is complete on {app.uri} "
               "and matches the settings")
    if entries == "topic":
        click.echo("warning: its queues have no entry exchanges (a ladder of celery_delayq 1.0.0rc1 or earlier): "
                   "publishes enter through the level exchanges, which the broker confirms more slowly. "
                   "`celery -A APP delayq topology declare` adds them and touches no waiting task.", err=True)
    if api is not None and rows is not None and nodes is not None and len(nodes) >= 2:
        # On a multi-node cluster: why and how to spread a ladder whose leaders are not.
        found = leaders_finding(rows, nodes, names, ApiReach(api.base_url, "ok"),
                                vhost=api.vhost, namespace=app.config.spec.namespace)
        if found.status == WARN:
            click.echo(f"warning: {found.summary} {found.next_step}", err=True)


def _held_for(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """``--held-for``: a finite number of seconds above 0 and at most :data:`HELD_FOR_MAX_S`."""
    if not (math.isfinite(value) and 0 < value <= HELD_FOR_MAX_S):
        raise click.BadParameter(f"{value!r} is not a number of seconds above 0 and at most {HELD_FOR_MAX_S:g}")
    return value


@topology.command(cls=Action, action="topology-recover")
@click.option("--held-for", type=float, default=2.0, show_default=True, metavar="SECONDS", callback=_held_for,
              help=f"How long a queue must keep holding messages to count as stuck (above 0, at most "
                   f"{HELD_FOR_MAX_S:g}).")
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
    recovery = Recovery(api, app.config.spec.prefix)
    stuck = recovery.stuck(held_for=held_for)
    if stuck is None:
        raise click.ClickException(f"the management API at {api.base_url} did not list the queues")
    if not stuck:
        click.echo(f"no ladder queue of {app.config.spec.prefix!r} holds messages on {app.uri}: nothing to do")
        return
    if not recovery.touch():
        raise click.ClickException(f"{sum(stuck.values())} message(s) are held in {len(stuck)} queue(s), and "
                                   "the broker refused the policy that moves them: the management user needs "
                                   "the 'policymaker' (or 'administrator') tag")
    still = recovery.still_held(stuck)
    audit_action(ctx, prefix=app.config.spec.prefix, held=sum(stuck.values()), queues=len(stuck), still=len(still))
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


def broker_listing(api: ManagementAPI | None, where: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The vhost's queues and exchanges as the broker lists them (its management API).

    AMQP cannot list, so without the API there is no way to know what the
    prefix made, and a delete from the configuration would leave the exit
    queues of destinations it does not name (issue #31).

    Raises:
        click.ClickException: the API is off, unreachable, of another broker, or refused the user.
    """
    # An API that cannot list is said once, by the refusal, on one line: its own log lines are dropped meanwhile.
    logger, drop = logging.getLogger(ManagementAPI.__module__), (lambda _record: False)
    logger.addFilter(drop)
    try:
        queues = api.queues() if api is not None else None
        exchanges = api.exchanges() if api is not None and queues is not None else None
    finally:
        logger.removeFilter(drop)
    if queues is None or exchanges is None:
        why = ("is switched off (delayq_management_url = '')" if api is None else
               f"at {api.base_url} did not list them for this broker")
        raise click.ClickException(
            f"cannot list the queues and exchanges of {where}: RabbitMQ's management API {why}, and AMQP cannot "
            "list them; nothing was deleted. Enable the rabbitmq_management plugin (`rabbitmq-plugins enable "
            "rabbitmq_management`) and set delayq_management_url to its URL (a user with the management or "
            "monitoring tag), then delete again.")
    return queues, exchanges


#: How long the management API's message counts may lag (RabbitMQ's collect_statistics_interval, 5 s).
_API_STATS_LAG_S = 5.5


def _per_role(owned: Sequence[Owned], kind: str) -> str:
    counts = Counter(o.role for o in owned if o.kind == kind)
    return ", ".join(f"{role} {counts[role]}" for role in ROLES if counts[role])


def _describe_kept(selection: OwnedSelection, kept: Sequence[Owned], keep_shared: bool) -> list[str]:
    """What stays on the broker (``kept``: the selection's, counted now), and why, one line each."""
    lines: list[str] = []
    parking = [o for o in kept if o.role == "parking"]
    shared = [o for o in kept if o.role != "parking"]
    if shared:
        why = ("--keep-shared" if keep_shared else
               f"a ladder of another shape ({', '.join(sorted({o.shape for o in selection.other_shapes}))}) uses it")
        names = ", ".join(o.name for o in shared[:5]) + (" ..." if len(shared) > 5 else "")
        lines.append(f"kept ({why}): {len(shared)} shared queue(s)/exchange(s): {names}")
    for o in parking:
        held = f" with {o.messages} parked message(s)" if o.messages else ""
        lines.append(f"kept: parking queue {o.name}{held} (add --parking to delete it)")
    if selection.other_shapes:
        shapes = Counter(o.shape for o in selection.other_shapes)
        shown = ", ".join(f"{shape} ({n})" for shape, n in sorted(shapes.items()))
        lines.append(f"left alone: the ladder(s) of another shape of this prefix: {shown} queue(s)/exchange(s); "
                     "delete them with that shape's delayq_levels and delayq_radix")
    return lines


@topology.command(cls=Action, action="topology-delete")
@click.option("--discard-messages", is_flag=True,
              help="Delete even queues that still hold delayed (or, with --parking, parked) messages: they are lost.")
@click.option("--parking", "with_parking", is_flag=True,
              help="Also delete the parking queue (<prefix>.parking, or delayq_parking_queue) and what is parked "
                   "in it. Kept otherwise.")
@click.option("--keep-shared", is_flag=True,
              help="Keep what every shape (levels, radix) of the prefix shares: <prefix>.unroutable, <prefix>.laps, "
                   "the exit and fixed queues. Use it to delete an old shape while a reshaped ladder of the same "
                   "prefix stays in use.")
@click.option("--shape", metavar="LEVELSxRADIX",
              help="Delete the drained ladder of an earlier shape of this prefix (e.g. 14x4, as "
                   "delayq_previous_shapes names it), keeping everything the current ladder shares. Refuses "
                   "while tasks still wait in it.")
@click.option("--destination", "-d", multiple=True, metavar=_DESTINATION_HELP, hidden=True,
              help="Not needed any more (every exit queue of the prefix is found in the broker's listing); "
                   "still checked, for scripts that pass it.")
@yes_option
@click.pass_context
def delete(ctx: click.Context, discard_messages: bool, with_parking: bool, keep_shared: bool, shape: str | None,
           destination: tuple[str, ...], yes: bool) -> None:
    """Delete every queue and exchange of the ladder. Refuses while messages wait in them.

    What to delete comes from the broker's own listing of the virtual host
    (RabbitMQ's management API), not from the app's settings: every name the
    prefix's naming scheme makes, and no other (another app's
    <prefix>x.… or <prefix>.tasks stays): the levels of every shard,
    the delivery exchange, the index streams, the exit queue of every
    destination ever published to, the fixed and buckets backends' queues, the laps
    and unroutable queues and exchange. The parking queue only with
    --parking. Without the management API it refuses (AMQP cannot list
    queues), and deletes nothing.
    """
    app = app_context(ctx)
    if with_parking and (keep_shared or shape):
        raise BadInput("--parking deletes the parking queue, which --keep-shared and --shape keep (every shape of "
                       "the prefix shares it); give one of them")
    earlier: tuple[int, int] | None = None
    if shape is not None:  # (levels, radix) of an earlier ladder of the prefix, never the one the app uses now
        try:
            [earlier] = CONVERTERS["previous_shapes"](shape)
        except (SettingsError, ValueError):
            raise BadInput(f"--shape {shape!r} is not a ladder shape: give LEVELSxRADIX, e.g. 14x4") from None
        if earlier == (app.config.levels, app.config.radix):
            raise BadInput(f"--shape {shape} is the shape this app uses now (delayq_levels={app.config.levels}, "
                           f"delayq_radix={app.config.radix}): --shape deletes an earlier one; without it, delete "
                           "deletes this one")
    keep_shared = keep_shared or earlier is not None
    with app.connected() as raw:
        topo = app.topology(raw)
        parse_destinations(topo, destination)  # checked only: the listing has every exit queue
        spec = topo.spec if earlier is None else dataclasses.replace(topo.spec, levels=earlier[0], radix=earlier[1])

        def survey() -> tuple[OwnedSelection, list[Owned], list[str]]:
            queues, exchanges = broker_listing(app.api(raw), app.uri)
            selection = select_owned(spec, queues, exchanges, parking_queue=app.config.parking_queue_name,
                                     with_parking=with_parking, keep_shared=keep_shared)
            return (selection, topo.look(raw, selection.delete),
                    _describe_kept(selection, topo.look(raw, selection.kept), keep_shared))

        selection, present, kept = survey()
        if not discard_messages and any(o.messages and not o.stream for o in present if o.kind == "queue"):
            # The API's counts lag its statistics by up to 5 s: a ladder that drained a moment ago
            # (the last task just ran) is still listed with messages. Look once more before refusing.
            time.sleep(_API_STATS_LAG_S)
            selection, present, kept = survey()
        if not present:
            other = (f"; {spec.unroutable_queue} is kept: a ladder of another shape (delayq_levels, delayq_radix) "
                     "shares it" if selection.other_shapes and any(o.role == "unroutable" for o in selection.kept)
                     else "")
            click.echo(f"no ladder named {spec.prefix!r} ({spec.namespace}) on {app.uri}: nothing to delete{other}")
            for line in kept:
                click.echo(line, err=True)
            return
        in_queues = [o for o in present if o.kind == "queue"]
        busy = [o for o in in_queues if o.messages and not o.stream]
        held = sum(o.messages or 0 for o in busy)
        if busy and not discard_messages:
            names = ", ".join(f"{o.name} ({o.messages})" for o in busy[:5]) + (" ..." if len(busy) > 5 else "")
            raise click.ClickException(
                f"{held} message(s) still wait in {len(busy)} queue(s) of ladder {spec.prefix!r}: "
                f"{names}. Nothing was deleted. Wait until they are delivered, or add --discard-messages "
                "to drop them.")
        lost = f", dropping the {held} message(s) they hold" if held else ""
        confirm(f"Delete ladder {spec.prefix!r} on {app.uri}: {len(present) - len(in_queues)} exchanges "
                f"and {len(in_queues)} queues{lost}?", yes)
        deleted = set(topo.delete_listed(raw, present, if_empty=not discard_messages))
        again = topo.look(raw, present)  # a worker or publisher still running declares the ladder again
    gone = [o for o in present if f"{o.kind} {o.name}" in deleted]
    n_exchanges = sum(1 for o in gone if o.kind == "exchange")
    audit_action(ctx, prefix=spec.prefix, queues=len(gone) - n_exchanges, exchanges=n_exchanges, dropped=held)
    exits = [o.name for o in gone if o.role in ("exit", "fixed", "buckets")]
    click.echo(f"deleted ladder {spec.prefix!r} on {app.uri}: {n_exchanges} exchanges, "
               f"{len(gone) - n_exchanges} queues ({sum(1 for o in gone if o.role == 'exit')} of them exit queues)")
    click.echo(f"  queues: {_per_role(gone, 'queue') or 'none'}; exchanges: {_per_role(gone, 'exchange') or 'none'}")
    if exits:
        click.echo(f"  exit, fixed and bucket queues: {', '.join(exits)}")
    for line in kept:
        click.echo(line, err=True)
    if again:
        names = ", ".join(f"{o.kind} {o.name}" for o in again[:5]) + (" ..." if len(again) > 5 else "")
        raise click.ClickException(
            f"{len(again)} of them are back on the broker ({names}): a worker or publisher of this app still runs "
            "and declares the ladder again. Stop them, then delete again.")
