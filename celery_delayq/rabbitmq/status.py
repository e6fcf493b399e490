"""The status of an app's ladder on its broker: what waits, what is parked, what could not be routed.

:func:`ladder_status` is the document of ``delayq status --json``, which the metrics endpoint and the web page
read too. Read-only: passive declares only. A message's due time cannot be seen without taking it out, but queue
``(k, d)``'s TTL bounds it: ``((d + 1) * radix**k - 1) * unit`` from now.

Its keys (``schema`` 1; keys are only ever added) are listed in docs/operations.md, "``delayq status --json``".
Counts are *ready* messages (AMQP cannot see expiring ones). Exit status 1: no ladder of the app's shape.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import amqp

from ..config import DelayqConfig
from ..ladder.humanize import human_duration
from ..ladder.moments import iso
from ..ladder.spec import LadderSpec
from .management import ManagementAPI
from .placement import leader_counts, owned_leaders
from .recovery import held_on_two_looks
from .topology import LadderState, Topology

__all__ = ["ladder_status", "LadderView", "SCHEMA"]


class LadderView(Protocol):
    """What :func:`ladder_status` reads of an app's ladder (the glue's ``AppLadder`` is one)."""

    @property
    def config(self) -> DelayqConfig: ...

    @property
    def uri(self) -> str: ...

    def topology(self, raw: amqp.Connection) -> Topology: ...

    def api(self, raw: amqp.Connection) -> ManagementAPI | None: ...

#: Version of the ``--json`` document.
SCHEMA = 1


def _due_within_s(spec: LadderSpec, k: int, digit: int) -> float:
    """Longest a message now in queue ``(k, digit)`` can still wait: this queue plus every lower digit."""
    return float(((digit + 1) * spec.radix**k - 1) * spec.unit_ms / 1000.0)


def _queue_doc(state: LadderState, name: str) -> dict[str, Any]:
    found = state.queue(name)
    return {"queue": name, "exists": found.exists, "messages": found.messages or 0}


def ladder_status(app: LadderView, raw: amqp.Connection, *, now: float | None = None) -> dict[str, Any]:
    """The ``--json`` document (see the module docstring) for the app's ladder, by passive declares."""
    now = time.time() if now is None else now
    spec, parking_queue = app.config.spec, app.config.parking_queue_name
    topo = app.topology(raw)
    state = topo.inspect(raw, extra_queues=[parking_queue])
    api = app.api(raw) if state.exists else None
    level_names = [q.name for q in spec.level_queues()]
    every = api.queues() if api is not None else None
    wanted = set(level_names)
    rows = [r for r in every if r.get("name") in wanted] if every is not None else None
    held_now = held_on_two_looks(api, spec.prefix, first=every) if every is not None and api is not None else None
    nodes = api.running_nodes() if rows is not None and api is not None else None
    leader_of = {str(r.get("name")): str(r.get("leader") or r.get("node")) for r in rows or []}
    kinds = {name: kind for kind, name, _args in topo.owned_queues()}
    kinds[parking_queue] = "parking"
    by_kind = owned_leaders(every, kinds, f"{spec.prefix}.exit.") if every is not None else None
    levels: list[dict[str, Any]] = []
    for k in range(spec.levels - 1, -1, -1):
        queues: list[dict[str, Any]] = []
        for shard in range(spec.shards):
            for d in range(1, spec.radix):
                found = state.queue(spec.level_queue(k, d, shard))
                queues.append({"queue": found.name, "digit": d, "shard": shard,
                               "ttl_s": spec.queue_ttl_ms(k, d) / 1000.0,
                               "due_within_s": _due_within_s(spec, k, d), "exists": found.exists,
                               "messages": found.messages or 0, "leader": leader_of.get(found.name)})
        busy = [float(q["due_within_s"]) for q in queues if q["messages"]]
        levels.append({"level": k, "messages": sum(q["messages"] for q in queues),
                       "due_within_s": max(busy) if busy else None, "queues": queues})
    bounds = [lv["due_within_s"] for lv in levels if lv["due_within_s"] is not None]
    parking = _queue_doc(state, parking_queue)
    unroutable = _queue_doc(state, spec.unroutable_queue)
    ladder_parts = state.entities[: len(state.entities) - 1]  # the parking queue is not part of the ladder
    return {
        "schema": SCHEMA,
        "observed_at": iso(now),
        "broker": app.uri,
        "ladder": {"prefix": spec.prefix, "namespace": spec.namespace, "radix": spec.radix, "levels": spec.levels,
                   "shards": spec.shards, "unit_ms": spec.unit_ms, "max_delay_s": spec.max_delay_s,
                   "max_delay": human_duration(spec.max_delay_s)},
        "exists": state.exists,
        "complete": all(e.exists for e in ladder_parts),
        "missing": [f"{e.kind} {e.name}" for e in ladder_parts if not e.exists],
        "totals": {"waiting": sum(lv["messages"] for lv in levels), "parked": parking["messages"],
                   "unroutable": unroutable["messages"],
                   "held": sum(held_now.values()) if held_now is not None else None},
        "levels": levels,
        "parking": parking,
        "unroutable": unroutable,
        "next_due_by": iso(now + min(bounds)) if bounds else None,
        "all_due_by": iso(now + max(bounds)) if bounds else None,
        "nodes": nodes,
        "leaders": leader_counts(rows or [], level_names),
        "leaders_by_kind": by_kind,
        "held": held_now,
    }


