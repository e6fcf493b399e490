"""Infrastructure-as-code export of the ladder (pure: topology in, text out), for ``delayq_declare = False``.

Both formats hold the same :func:`plan`: RabbitMQ definitions JSON, or a Terraform module for
the ``cyrilgdn/rabbitmq`` provider whose bindings and dead-letter targets *reference* what they
need (so Terraform creates it first) and whose resource names come from the ladder (``level07_d3``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping

from .delivery_limit import declare_arguments
from .topology import Destination, Topology

if TYPE_CHECKING:
    from ..config import DelayqConfig

__all__ = ["Entity", "Link", "Plan", "ParkingQueueDef", "parking_queue_def", "plan", "definitions", "terraform",
           "PROVIDER_SOURCE", "PROVIDER_VERSION"]

#: The Terraform provider the export is written for, and the versions known to fit it:
#: the ``rabbitmq_vhost`` data source arrived in 1.7.0; 1.8.0 supports RabbitMQ 3.9+.
PROVIDER_SOURCE = "cyrilgdn/rabbitmq"
PROVIDER_VERSION = "~> 1.8"

#: Queue and exchange arguments whose value names another exchange of the plan.
_EXCHANGE_REFERENCES = ("x-dead-letter-exchange", "alternate-exchange")


@dataclass(frozen=True)
class ParkingQueueDef:
    """The parking queue as the app declares it: its name and declare arguments."""

    name: str
    arguments: Mapping[str, Any]


def parking_queue_def(config: "DelayqConfig", ladder_queue_type: str,
                      broker_version: tuple[int, ...] | None = None) -> ParkingQueueDef:
    """The app's parking queue, with the arguments the app declares it with on ``broker_version``.

    (:func:`celery_delayq.rabbitmq.delivery_limit.declare_arguments`; unknown version: a 3.x
    broker's, i.e. no ``x-delivery-limit``.)
    """
    qtype = ladder_queue_type if config.parking_queue_type == "auto" else config.parking_queue_type
    return ParkingQueueDef(config.parking_queue_name, declare_arguments(qtype, broker_version or (3,)))


@dataclass(frozen=True)
class Entity:
    """An exchange or a queue of the plan.

    Attributes:
        kind: ``exchange`` or ``queue``.
        name: Its name on the broker.
        key: Stable resource name derived from the ladder (``level07_d3``, ``deliver``, ``exit_...``).
        type: Exchange type (``topic``, ``fanout``); empty for queues.
        arguments: Declare arguments.
    """

    kind: Literal["exchange", "queue"]
    name: str
    key: str
    type: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Link:
    """A binding of the plan, between two of its entities (by key)."""

    key: str
    source: str
    destination: str
    destination_type: Literal["exchange", "queue"]
    routing_key: str


@dataclass(frozen=True)
class Plan:
    """Everything an export writes, in dependency order (what a thing needs comes first)."""

    ladder: str
    exchanges: tuple[Entity, ...]
    queues: tuple[Entity, ...]
    bindings: tuple[Link, ...]


def _identifier(text: str) -> str:
    # Terraform names: letters, digits, '_' and '-', not starting with a digit.
    name = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "x"
    return name if not name[0].isdigit() else f"_{name}"


def plan(topo: Topology, *, exits: Iterable[Destination] = (), parking: ParkingQueueDef | None = None) -> Plan:
    """The ladder of ``topo`` plus the given exit queues and parking queue, with stable keys."""
    s = topo.spec
    keys: dict[tuple[str, str], str] = {
        ("exchange", s.unroutable_exchange): "unroutable",
        ("queue", s.unroutable_queue): "unroutable",
        ("exchange", s.delivery_exchange): "deliver",
        ("queue", s.laps_queue): "laps",
    }
    if topo.index is not None:  # the index of waiting tasks and the cancel log (streams)
        for name in topo.index.shard_queues:
            keys[("queue", name)] = "index_" + _identifier(name[len(s.namespace) + len(".index."):])
        keys[("queue", topo.index.cancel_queue)] = "cancels"
    def tag(shard: int) -> str:  # shard 0 keeps the unsharded keys
        return f"s{shard}_" if shard else ""

    for shard in range(s.shards):
        for k in range(s.levels):
            keys[("exchange", s.level_exchange(k, shard))] = f"{tag(shard)}level{k:02d}"
    for q in s.level_queues():
        keys[("queue", q.name)] = f"{tag(q.shard)}level{q.level:02d}_d{q.digit}"
        keys[("exchange", s.entry_exchange_of(q.level, q.digit, q.shard))] = f"{tag(q.shard)}level{q.level:02d}_d{q.digit}_entry"

    exchanges: list[Entity] = []
    queues: list[Entity] = []
    for kind, name, args in topo.entities():
        if kind.startswith("exchange"):
            exchanges.append(Entity("exchange", name, keys[("exchange", name)], kind.split(":")[1], dict(args)))
        else:
            queues.append(Entity("queue", name, keys[("queue", name)], "", dict(args)))
    if parking is not None:
        queues.append(Entity("queue", parking.name, "parking", "", dict(parking.arguments)))

    bindings = [Link("unroutable", "unroutable", "unroutable", "queue", "")]
    entries = set(s.entry_exchanges())
    for b in s.bindings():
        source = keys[("exchange", b.source)]
        dest = keys[(b.destination_kind, b.destination)]
        # A queue has one binding from its level and one from its entry exchange, so it lends them its name
        # (the entry's with ``_entry``); the ladder's only exchange-to-exchange binding per level is digit 0's
        # pass-through.
        name = (source if b.source in entries else dest) if b.destination_kind == "queue" else f"{source}_d0"
        bindings.append(Link(name, source, dest, b.destination_kind, b.routing_key))
    for exit_ in dict.fromkeys(exits):
        key = _identifier(exit_.exit_queue[len(s.prefix):])
        queues.append(Entity("queue", exit_.exit_queue, key, "", topo.exit_queue_args(exit_.exchange, exit_.routing_key)))
        bindings.append(Link(key, "deliver", key, "queue", s.exit_binding_key(exit_.token)))

    for what, items in (("exchange", exchanges), ("queue", queues), ("binding", bindings)):
        seen = [i.key for i in items]
        dupes = sorted({k for k in seen if seen.count(k) > 1})
        if dupes:  # pragma: no cover - a ladder naming bug, not a user error
            raise AssertionError(f"two {what}s share the resource name(s) {dupes}")
    label = (f"{s.prefix!r}: {s.levels} levels, radix {s.radix}, unit {s.unit_ms} ms, "
             f"{topo.queue_type} queues")
    return Plan(label, tuple(exchanges), tuple(queues), tuple(bindings))


# -- definitions JSON -----------------------------------------------------------

def definitions(topo: Topology, *, vhost: str = "/", exits: Iterable[Destination] = (),
                parking: ParkingQueueDef | None = None) -> str:
    """RabbitMQ definitions JSON for the ladder, its exit queues and its parking queue.

    No ``vhosts`` or ``permissions`` section: create those before ``rabbitmqctl import_definitions FILE``.
    """
    p = plan(topo, exits=exits, parking=parking)
    names = {(e.kind, e.key): e.name for e in p.exchanges + p.queues}
    doc: dict[str, Any] = {
        "exchanges": [{"name": e.name, "vhost": vhost, "type": e.type, "durable": True, "auto_delete": False,
                       "internal": False, "arguments": dict(e.arguments)} for e in p.exchanges],
        "queues": [{"name": q.name, "vhost": vhost, "durable": True, "auto_delete": False,
                    "arguments": dict(q.arguments)} for q in p.queues],
        "bindings": [{"source": names[("exchange", b.source)], "vhost": vhost,
                      "destination": names[(b.destination_type, b.destination)],
                      "destination_type": b.destination_type, "routing_key": b.routing_key, "arguments": {}}
                     for b in p.bindings],
    }
    return json.dumps(doc, indent=2, sort_keys=True)


# -- Terraform ------------------------------------------------------------------------

@dataclass
class _Block:
    header: str
    items: list[Any] = field(default_factory=list)  # (name, value lines) | _Block | None (blank line)

    def attr(self, name: str, value: str | list[str]) -> "_Block":
        self.items.append((name, [value] if isinstance(value, str) else value))
        return self

    def block(self, header: str) -> "_Block":
        child = _Block(header)
        self.items.append(child)
        return child

    def render(self, indent: str = "") -> list[str]:
        """Lines laid out as ``terraform fmt`` does: a run of one-line attributes aligns its '='."""
        inner = indent + "  "
        out = [f"{indent}{self.header} {{"]
        run: list[tuple[str, str]] = []

        def flush() -> None:
            width = max((len(n) for n, _ in run), default=0)
            out.extend(f"{inner}{n.ljust(width)} = {v}" for n, v in run)
            run.clear()

        for item in self.items:
            if isinstance(item, tuple) and len(item[1]) == 1:
                run.append((item[0], item[1][0]))
                continue
            flush()
            if item is None:
                out.append("")
            elif isinstance(item, _Block):
                out.extend(item.render(inner))
            else:  # a multi-line value stands alone
                name, lines = item
                out.append(f"{inner}{name} = {lines[0]}")
                out.extend(f"{inner}{line}" for line in lines[1:])
        flush()
        out.append(f"{indent}}}")
        return out


def _string(value: str) -> str:
    # JSON string syntax is HCL's, except that "${" and "%{" start templates there.
    return json.dumps(value).replace("${", "$${").replace("%{", "%%{")


def _object(entries: list[tuple[str, str]], *, quote: bool = True) -> list[str]:
    """A multi-line HCL object constructor with aligned keys (values are HCL expressions)."""
    keys = [_string(k) if quote else k for k, _ in entries]
    width = max(map(len, keys))
    return ["{"] + [f"  {k.ljust(width)} = {v}" for k, (_, v) in zip(keys, entries)] + ["}"]


def terraform(topo: Topology, *, vhost: str = "/", exits: Iterable[Destination] = (),
              parking: ParkingQueueDef | None = None) -> str:
    """A Terraform module (``cyrilgdn/rabbitmq`` provider) for the ladder, exits and parking queue.

    The ``vhost`` variable (default ``vhost``) must name an existing vhost (a data source reads it).
    """
    p = plan(topo, exits=exits, parking=parking)
    exchange_keys = {e.name: e.key for e in p.exchanges}

    def value(key: str, v: Any) -> str:
        if key in _EXCHANGE_REFERENCES and isinstance(v, str) and v in exchange_keys:
            return f"rabbitmq_exchange.{exchange_keys[v]}.name"
        return _string(v) if isinstance(v, str) else json.dumps(v)

    blocks: list[_Block] = []
    tf = _Block("terraform")
    provider = tf.block("required_providers")
    provider.attr("rabbitmq", _object([("source", _string(PROVIDER_SOURCE)), ("version", _string(PROVIDER_VERSION))],
                                      quote=False))
    blocks.append(tf)
    var = _Block('variable "vhost"')
    var.attr("description", _string("RabbitMQ vhost of the ladder; it must exist "
                                    "(create it and its permissions first)."))
    var.attr("type", "string").attr("default", _string(vhost))
    blocks.append(var)
    blocks.append(_Block('data "rabbitmq_vhost" "ladder"').attr("name", "var.vhost"))

    for e in p.exchanges + p.queues:
        b = _Block(f'resource "rabbitmq_{e.kind}" "{e.key}"')
        b.attr("name", _string(e.name)).attr("vhost", "data.rabbitmq_vhost.ladder.name")
        settings = b.block("settings")
        if e.type:
            settings.attr("type", _string(e.type))
        settings.attr("durable", "true").attr("auto_delete", "false")
        obj = _object([(k, value(k, v)) for k, v in sorted(e.arguments.items())]) if e.arguments else None
        if obj and e.kind == "exchange":
            settings.attr("arguments", obj)
        elif obj:  # a queue's arguments are one JSON string
            settings.attr("arguments_json", [f"jsonencode({obj[0]}", *obj[1:-1], f"{obj[-1]})"])
        blocks.append(b)
    for link in p.bindings:
        b = _Block(f'resource "rabbitmq_binding" "{link.key}"')
        b.attr("source", f"rabbitmq_exchange.{link.source}.name")
        b.attr("vhost", f"rabbitmq_exchange.{link.source}.vhost")
        b.attr("destination", f"rabbitmq_{link.destination_type}.{link.destination}.name")
        b.attr("destination_type", _string(link.destination_type))
        b.attr("routing_key", _string(link.routing_key))
        blocks.append(b)

    head = [
        f"# celery_delayq ladder {p.ladder}.",
        "# Generated by `celery -A APP delayq export --format terraform`; do not edit by hand.",
        "# Bindings and dead-letter targets reference what they need, so one `terraform apply` creates",
        "# everything in order. Configure the provider (endpoint, credentials) in the calling module.",
    ]
    body = "\n\n".join("\n".join(b.render()) for b in blocks)
    return "\n".join(head) + "\n\n" + body + "\n"
