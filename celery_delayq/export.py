"""Infrastructure-as-code export of the ladder. Pure: topology in, text out.

Platform teams that do not let applications declare broker objects can
create the ladder with their own tooling instead, then run the app with
``delayq_declare = False`` (verify-only). Two formats:

* ``definitions``: RabbitMQ definitions JSON, for ``rabbitmqctl import_definitions``
  or the management UI/API's import.
* ``terraform``: resources of the ``cyrilgdn/rabbitmq`` Terraform provider.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from .topology import Destination, Topology

__all__ = ["definitions", "terraform"]


def _queues_and_exchanges(topo: Topology, exits: Iterable[Destination]) -> tuple[list[tuple[str, str, dict[str, Any]]], list[dict[str, str]]]:
    entities = list(topo.entities())
    bindings = [
        {"source": b.source, "destination": b.destination, "destination_type": b.destination_kind,
         "routing_key": b.routing_key}
        for b in topo.spec.bindings()
    ]
    bindings.append({"source": topo.spec.unroutable_exchange, "destination": topo.spec.unroutable_queue,
                     "destination_type": "queue", "routing_key": ""})
    for dest in exits:
        entities.append(("queue", dest.exit_queue, topo.exit_queue_args(dest.exchange, dest.routing_key)))
        bindings.append({"source": topo.spec.delivery_exchange, "destination": dest.exit_queue,
                         "destination_type": "queue", "routing_key": topo.spec.exit_binding_key(dest.token)})
    return entities, bindings


def definitions(topo: Topology, *, vhost: str = "/", exits: Iterable[Destination] = ()) -> str:
    """RabbitMQ definitions JSON for the whole ladder (plus the given exit queues)."""
    entities, bindings = _queues_and_exchanges(topo, exits)
    doc: dict[str, Any] = {"queues": [], "exchanges": [], "bindings": []}
    for kind, name, args in entities:
        if kind == "queue":
            doc["queues"].append({"name": name, "vhost": vhost, "durable": True, "auto_delete": False,
                                  "arguments": args})
        else:
            doc["exchanges"].append({"name": name, "vhost": vhost, "type": kind.split(":")[1], "durable": True,
                                     "auto_delete": False, "internal": False, "arguments": args})
    for b in bindings:
        doc["bindings"].append({**b, "vhost": vhost, "arguments": {}})
    return json.dumps(doc, indent=2, sort_keys=True)


def _hcl_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _hcl_value(value: Any) -> str:
    return json.dumps(value)


def terraform(topo: Topology, *, vhost: str = "/", exits: Iterable[Destination] = ()) -> str:
    """Terraform (``cyrilgdn/rabbitmq`` provider) resources for the ladder."""
    entities, bindings = _queues_and_exchanges(topo, exits)
    out = [f"# celery_delayq ladder {topo.spec.prefix!r}: {topo.spec.levels} levels, radix {topo.spec.radix}, "
           f"unit {topo.spec.unit_ms} ms, {topo.queue_type} queues. Generated; do not edit by hand.\n"]
    for kind, name, args in entities:
        if kind == "queue":
            out.append(f'resource "rabbitmq_queue" "{_hcl_name(name)}" {{\n  name  = {_hcl_value(name)}\n'
                       f'  vhost = {_hcl_value(vhost)}\n  settings {{\n    durable     = true\n'
                       f'    auto_delete = false\n    arguments_json = {_hcl_value(json.dumps(args, sort_keys=True))}\n  }}\n}}\n')
        else:
            out.append(f'resource "rabbitmq_exchange" "{_hcl_name(name)}" {{\n  name  = {_hcl_value(name)}\n'
                       f'  vhost = {_hcl_value(vhost)}\n  settings {{\n    type        = {_hcl_value(kind.split(":")[1])}\n'
                       f'    durable     = true\n    auto_delete = false\n'
                       + ('    arguments = {\n' + "".join(f'      {_hcl_value(k)} = {_hcl_value(v)}\n' for k, v in args.items()) + '    }\n' if args else "")
                       + '  }\n}\n')
    for i, b in enumerate(bindings):
        out.append(f'resource "rabbitmq_binding" "b{i:03d}_{_hcl_name(b["destination"])}" {{\n'
                   f'  source           = {_hcl_value(b["source"])}\n  vhost            = {_hcl_value(vhost)}\n'
                   f'  destination      = {_hcl_value(b["destination"])}\n'
                   f'  destination_type = {_hcl_value(b["destination_type"])}\n'
                   f'  routing_key      = {_hcl_value(b["routing_key"])}\n}}\n')
    return "\n".join(out)
