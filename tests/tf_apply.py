"""Apply the Terraform export over AMQP, as the cyrilgdn/rabbitmq provider would, in the worst order.

The provider cannot be downloaded here (no network), so ``terraform init``,
``validate`` and ``apply`` cannot run. What makes a first apply fail is
ordering: Terraform creates every resource whose references are satisfied
in parallel, so a binding that names its exchange literally may be created
before the exchange exists (404). This helper reproduces exactly that:

* the dependency graph comes from the references in the HCL (python-hcl2);
* resources are created in waves, each wave being everything whose
  references are created, and *within* a wave bindings go first, then
  queues, then exchanges: the order in which a missing reference fails;
* every value is evaluated by Terraform itself (``terraform console``, which
  needs no provider) once references are replaced by the names they stand for;
* each resource becomes the AMQP declare or bind the provider's HTTP call
  would make, on the vhost that the resource's own ``vhost`` names.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

import amqp
import hcl2
from hcl2 import SerializationOptions

__all__ = ["Resource", "load", "apply", "terraform_eval", "TERRAFORM"]

TERRAFORM = shutil.which("terraform")
REFERENCE = re.compile(
    r"\b(data\.rabbitmq_vhost|rabbitmq_exchange|rabbitmq_queue|rabbitmq_binding|var)\.(\w+)(?:\.(\w+))?")
_OPTIONS = SerializationOptions(explicit_blocks=False, with_comments=False)  # strings keep their HCL quotes


@dataclass
class Resource:
    """One block of the module: its address, type and attributes as HCL expression text."""

    address: str
    type: str
    body: dict[str, Any]
    needs: set[str] = field(default_factory=set)
    values: dict[str, Any] = field(default_factory=dict)


def _expressions(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [e for v in value.values() for e in _expressions(v)]
    if isinstance(value, list):
        return [e for v in value for e in _expressions(v)]
    return [value] if isinstance(value, str) else []


def _address(match: re.Match[str]) -> str:
    kind, name, _attr = match.groups()
    return f"var.{name}" if kind == "var" else f"{kind}.{name}"


def load(text: str) -> dict[str, Resource]:
    """The module's variables, data sources and resources, each with the addresses it references."""
    doc = hcl2.loads(text, serialization_options=_OPTIONS)
    out: dict[str, Resource] = {}
    for var in doc.get("variable", []):
        for name, body in var.items():
            address = f"var.{name.strip(chr(34))}"
            out[address] = Resource(address, "variable", body)
    for kind in ("data", "resource"):
        for block in doc.get(kind, []):
            for rtype, named in block.items():
                for rname, body in named.items():
                    rtype, rname = rtype.strip('"'), rname.strip('"')
                    address = f"data.{rtype}.{rname}" if kind == "data" else f"{rtype}.{rname}"
                    out[address] = Resource(address, rtype, body)
    for res in out.values():
        for expr in _expressions(res.body):
            res.needs.update(_address(m) for m in REFERENCE.finditer(expr))
        missing = res.needs - out.keys()
        assert not missing, f"{res.address} references undeclared {sorted(missing)}"
    return out


def terraform_eval(expressions: list[str]) -> list[Any]:
    """Evaluate closed HCL expressions with ``terraform console`` (no provider needed)."""
    assert TERRAFORM, "terraform is not installed"
    line = "jsonencode([" + ", ".join(expressions) + "])"
    with tempfile.TemporaryDirectory() as empty:
        out = subprocess.run([TERRAFORM, "console"], input=line + "\n", cwd=empty, capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(json.loads(out.stdout.strip()))


def _evaluate(resources: dict[str, Resource]) -> None:
    """Replace references by what they stand for, then have Terraform evaluate every attribute."""
    def hcl_text(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return json.dumps(value)
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k} = {hcl_text(v)}" for k, v in value.items()) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(hcl_text(v) for v in value) + "]"
        return value[2:-1] if value.startswith("${") and value.endswith("}") else value

    # Names and the vhost are literals or one reference away: resolve those first.
    literal: dict[str, str] = {}
    var = resources["var.vhost"].body["default"]
    literal["var.vhost"] = var
    literal["data.rabbitmq_vhost.ladder.name"] = var
    for res in resources.values():
        if "name" in res.body and res.type.startswith("rabbitmq_") and not res.address.startswith("data."):
            literal[f"{res.address}.name"] = res.body["name"]
            literal[f"{res.address}.vhost"] = var

    def close(expr: str) -> str:
        def sub(m: re.Match[str]) -> str:
            key = m.group(0)
            assert key in literal, f"cannot resolve {key}"
            return literal[key]
        return REFERENCE.sub(sub, expr)

    order: list[tuple[Resource, str]] = []
    texts: list[str] = []
    for res in resources.values():
        if res.type == "variable":
            continue
        for attr, value in res.body.items():
            order.append((res, attr))
            texts.append(close(hcl_text(value)))
    for (res, attr), value in zip(order, terraform_eval(texts)):
        res.values[attr] = value


def apply(text: str, connect: Any) -> list[str]:
    """Create every resource of ``text`` over AMQP in the worst order Terraform could pick.

    ``connect(vhost)`` returns a connected ``amqp.Connection`` to that vhost.
    Returns the addresses in creation order; raises what the broker raised.
    """
    resources = load(text)
    _evaluate(resources)
    created: set[str] = {a for a, r in resources.items() if r.type == "variable"}
    done: list[str] = []
    conns: dict[str, amqp.Connection] = {}
    rank = {"rabbitmq_binding": 0, "rabbitmq_queue": 1, "rabbitmq_exchange": 2}
    try:
        while len(created) < len(resources):
            wave = [r for a, r in resources.items() if a not in created and r.needs <= created]
            assert wave, f"reference cycle among {sorted(resources.keys() - created)}"
            for res in sorted(wave, key=lambda r: rank.get(r.type, -1)):
                _create(res, conns, connect)
                done.append(res.address)
            created.update(r.address for r in wave)
    finally:
        for c in conns.values():
            try:
                c.close()
            except Exception:
                pass
    return done


def _create(res: Resource, conns: dict[str, amqp.Connection], connect: Any) -> None:
    v = res.values
    vhost = v.get("vhost", v.get("name")) if res.type != "rabbitmq_vhost" else v["name"]
    if vhost not in conns:
        conns[vhost] = connect(vhost)  # the data source: fails when the vhost does not exist
    if res.type == "rabbitmq_vhost":
        return
    ch = conns[vhost].channel()
    try:
        if res.type == "rabbitmq_exchange":
            s = v["settings"][0]
            ch.exchange_declare(v["name"], s["type"], durable=s["durable"], auto_delete=s["auto_delete"],
                                arguments=s.get("arguments") or None)
        elif res.type == "rabbitmq_queue":
            s = v["settings"][0]
            args = json.loads(s["arguments_json"]) if s.get("arguments_json") else s.get("arguments")
            ch.queue_declare(v["name"], durable=s["durable"], auto_delete=s["auto_delete"], arguments=args or None)
        elif res.type == "rabbitmq_binding":
            if v["destination_type"] == "queue":
                ch.queue_bind(v["destination"], v["source"], v.get("routing_key", ""))
            else:
                ch.exchange_bind(v["destination"], v["source"], v.get("routing_key", ""))
        else:
            raise AssertionError(f"{res.address}: no AMQP equivalent for {res.type}")
    finally:
        if ch.is_open:
            ch.close()
