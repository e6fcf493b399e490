"""Where a new ladder's quorum queues lead: spread over the cluster, not all on the declaring node.

With the default ``client-local`` locator every queue of a ladder would lead on the node the
declaring process reached. So each queue a *new* ladder owns is declared through a connection
to the node that should lead it (nodes and listeners from the management API; nothing changes
without it or on one node); a later exit or parking queue goes where the fewest lead. Existing
queues never move. Why not the ``balanced`` locator: docs/clusters.md.

The planning is pure (:func:`spread`, :func:`amqp_addresses`, :func:`leader_counts`);
:class:`LeaderPlacement` does the I/O.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["spread", "amqp_addresses", "leader_counts", "owned_leaders", "LeaderPlacement", "WILDCARD_ADDRESSES"]

log = logging.getLogger(__name__)

#: Listener addresses that mean "every interface": the node's host name is used instead.
WILDCARD_ADDRESSES = frozenset({"::", "0.0.0.0", "", "[::]"})


def spread(queues: Sequence[str], nodes: Sequence[str], load: Mapping[str, int] | None = None) -> dict[str, str]:
    """Each queue's leader node: the least loaded (``load``: queues each node leads; ties by name) (pure).

    Without a load that is round robin in ladder order, so a level's digits lead on different nodes.
    """
    if not nodes:
        raise ValueError("no nodes to place queues on")
    ordered = sorted(nodes)
    counts = {node: int((load or {}).get(node, 0)) for node in ordered}
    placed: dict[str, str] = {}
    for name in queues:
        node = min(ordered, key=lambda n: (counts[n], ordered.index(n)))
        placed[name] = node
        counts[node] += 1
    return placed


def amqp_addresses(listeners: Iterable[Mapping[str, Any]], nodes: Iterable[str]) -> dict[str, tuple[str, int]]:
    """``node -> (host, port)`` of each running node's plain AMQP listener (``GET /api/overview``'s; pure).

    A listener bound to every interface is reached at the node name's host (``rabbit@HOST``).
    """
    running = set(nodes)
    found: dict[str, tuple[str, int]] = {}
    for item in listeners:
        node = str(item.get("node", ""))
        if node not in running or item.get("protocol") != "amqp" or node in found:
            continue
        host = str(item.get("ip_address", ""))
        if host in WILDCARD_ADDRESSES:
            host = node.partition("@")[2] or "localhost"
        found[node] = (host, int(item.get("port", 5672)))
    return found


def leader_counts(rows: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, int]:
    """How many of the queues ``names`` each node leads, from ``GET /api/queues`` rows (pure)."""
    return owned_leaders(rows, dict.fromkeys(names, "queues")).get("queues", {})


def owned_leaders(rows: Iterable[Mapping[str, Any]], kinds: Mapping[str, str],
                  exit_prefix: str | None = None) -> dict[str, dict[str, int]]:
    """``kind -> {node: queues it leads}`` for every queue a ladder owns, from ``GET /api/queues`` rows (pure).

    ``kinds``: queue name -> kind; names starting with ``exit_prefix`` are ``exits``.
    """
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        name = str(row.get("name", ""))
        kind = kinds.get(name) or ("exits" if exit_prefix and name.startswith(exit_prefix) else None)
        if kind is None:
            continue
        node = str(row.get("leader") or row.get("node") or "?")
        per_node = out.setdefault(kind, {})
        per_node[node] = per_node.get(node, 0) + 1
    return {kind: dict(sorted(nodes.items())) for kind, nodes in out.items()}


@dataclass
class LeaderPlacement:
    """Declares a new ladder's quorum queues each on the node that should lead it.

    Attributes:
        api: The broker's :class:`~celery_delayq.rabbitmq.management.ManagementAPI`.
        template: The kombu connection whose options the per-node connections copy.
    """

    api: Any
    template: Any
    connect_timeout: float = 5.0

    def plan(self, queues: Sequence[str], load: Mapping[str, int] | None = None
             ) -> tuple[dict[str, str], dict[str, tuple[str, int]]]:
        """Leader node per queue and node addresses; ``({}, {})`` on one node or when the API cannot tell."""
        nodes = self.api.running_nodes()
        if not nodes or len(nodes) < 2:
            return {}, {}
        listeners = self.api.amqp_listeners()
        addresses = amqp_addresses(listeners or [], nodes)
        if len(addresses) < 2:
            log.warning("delayq: %d-node cluster, but the management API names AMQP listeners for %d of them; "
                        "the new ladder's leaders stay where the broker puts them", len(nodes), len(addresses))
            return {}, {}
        return spread(queues, list(addresses), load), addresses

    def place(self, queues: Sequence[tuple[str, dict[str, Any]]],
              load: Mapping[str, int] | None = None, *, balance: bool = False) -> dict[str, str]:
        """Declare each ``(name, arguments)`` queue through a connection to its planned leader's node.

        ``load``: see :func:`spread`; ``balance`` without it counts the vhost's leaders. Returns
        ``queue -> node`` for the queues placed; an unreachable node's share stays on the
        caller's connection (best effort, logged).
        """
        if balance and load is None:
            if len(self.api.running_nodes() or ()) < 2:
                return {}  # one node (or the API cannot tell): nothing to balance, and no queue list to fetch
            rows = self.api.queues()
            load = leader_counts(rows, [str(r.get("name")) for r in rows]) if rows else None
        plan, addresses = self.plan([name for name, _args in queues], load)
        if not plan:
            return {}
        args_of = dict(queues)
        placed: dict[str, str] = {}
        by_node: dict[str, list[str]] = {}
        for name, node in plan.items():
            by_node.setdefault(node, []).append(name)
        for node, names in by_node.items():
            host, port = addresses[node]
            try:
                self._declare_on(host, port, [(name, args_of[name]) for name in names])
            except Exception as exc:  # noqa: BLE001 - placement is best effort, declaring is not
                log.warning("delayq: could not reach node %s at %s:%d to lead %d ladder queue(s) (%r); "
                            "they are declared through this connection instead", node, host, port, len(names), exc)
                continue
            placed.update((name, node) for name in names)
        log.info("delayq: %d new queue leaders spread over %d nodes", len(placed), len(by_node))
        return placed

    def _declare_on(self, host: str, port: int, queues: list[tuple[str, dict[str, Any]]]) -> None:
        conn = self.template.clone(hostname=host, port=port, connect_timeout=self.connect_timeout)
        try:
            conn.ensure_connection(max_retries=0)
            channel = conn.connection.channel()
            for name, args in queues:
                channel.queue_declare(name, durable=True, auto_delete=False, arguments=args)
            channel.close()
        finally:
            with contextlib.suppress(Exception):
                conn.release()
