"""RabbitMQ 3.x's file-handle budget: a new ladder is created only where it fits.

Before 4.0 every quorum queue replica reserves file handles (``2 + members`` on the leader, 2 on a follower)
against the node's limit, which client sockets share; past it the node silently stops accepting connections.
Before a *new* ladder (or shards) is declared, the management API's numbers are checked
(:class:`~celery_delayq.errors.FileHandleBudgetExceeded`); without the API only an explicit declare creates one
(:class:`~celery_delayq.errors.FileHandleBudgetUnknown`). Measurements and the reasoning: docs/footprint.md. The
arithmetic is pure; :class:`BudgetCheck` asks the API.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import FileHandleBudgetExceeded, FileHandleBudgetUnknown

__all__ = ["RESERVATIONS_GONE_FROM", "RESERVED_FOR_OTHERS", "quorum_reservations", "ladder_reservations",
           "headroom", "ladders_on", "BudgetCheck", "FIX"]

log = logging.getLogger(__name__)

#: First RabbitMQ version without per-queue file-handle reservations (its file-handle cache is gone).
RESERVATIONS_GONE_FROM = (4, 0)
#: What RabbitMQ 3.x keeps out of its file-handle cache's limit for other descriptors.
RESERVED_FOR_OTHERS = 100

#: How long the check waits for each management API answer (s).
API_TIMEOUT_S = 15.0
#: How long it waits for a just-started node's first statistics (its ``fd_total``; emitted every 5 s by default).
STATS_WAIT_S = 12.0
STATS_POLL_S = 0.5

#: The ways out, named in every refusal.
FIX = ("raise the broker's open-files limit (systemd `LimitNOFILE=65536` for rabbitmq-server, or `ulimit -n 65536` "
       "before starting it; on a live node `rabbitmqctl eval 'file_handle_cache:set_limit(N).'` up to that limit), "
       "delete ladders no longer used (`celery -A APP delayq topology delete` with their delayq_prefix), or share "
       "an existing ladder (the same delayq_prefix: one ladder serves any number of apps and queues)")

_LEVEL_QUEUE = re.compile(r"^(?P<namespace>.+\.\d+x\d+)(?:\.s\d+)?\.L\d\d(?:\.d\w)?$")


def quorum_reservations(queues: Iterable[Mapping[str, Any]], nodes: Iterable[str]) -> dict[str, int]:
    """File handles each node's quorum queue replicas reserve on RabbitMQ 3.x (pure; ``GET /api/queues`` rows)."""
    reserved = {node: 0 for node in nodes}
    for q in queues:
        if q.get("type") != "quorum":
            continue
        members = [str(m) for m in q.get("members") or ()]
        leader = str(q.get("leader") or q.get("node") or "")
        for member in set(members) | {leader}:
            if member in reserved:
                reserved[member] += 2 + len(members) if member == leader else 2
    return reserved


def ladder_reservations(quorum_queues: int, nodes: list[str], *, spread: bool) -> dict[str, int]:
    """What ``quorum_queues`` new quorum queues (every node a member) reserve on each node (pure).

    Leaders go round robin when ``spread``, else all on the first (declaring) node.
    """
    if not nodes:
        return {}
    members = len(nodes)
    counts = {node: 0 for node in nodes}
    for i in range(quorum_queues):
        counts[nodes[i % members] if spread else nodes[0]] += 1
    return {node: led * (2 + members) + (quorum_queues - led) * 2 for node, led in counts.items()}


def headroom(budget: int) -> int:
    """Handles kept free for client connections (one socket each): a tenth of the budget, at least 100."""
    return max(100, budget // 10)


def ladders_on(queues: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """``"vhost namespace" -> level queues`` of every ladder the rows show (pure), biggest first."""
    found: dict[str, int] = {}
    for q in queues:
        m = _LEVEL_QUEUE.match(str(q.get("name", "")))
        if m and q.get("type") == "quorum":
            key = f"{m.group('namespace')} (vhost {q.get('vhost', '/')})"
            found[key] = found.get(key, 0) + 1
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


@dataclass
class BudgetCheck:
    """Checks that new quorum queues fit the broker's file-handle budget (RabbitMQ 3.x only).

    Attributes:
        version: The broker's version.
        api: Its :class:`~celery_delayq.rabbitmq.management.ManagementAPI`, or ``None``.
        api_why: Why there is no usable API, for the refusal (``None``: ask it).
        spread: Whether a new ladder's leaders are spread over a cluster.
        explicit: An operator's explicit ``topology declare``: without the API it is never refused.
    """

    version: tuple[int, ...]
    api: Any = None
    api_why: str | None = None
    spread: bool = True
    explicit: bool = False
    #: Set when an explicit creation went ahead without the API's numbers: ``(namespace, quorum queues)``.
    unchecked: tuple[str, int] | None = None

    def _queues(self, limits: dict[str, int], adding: int) -> list[dict[str, Any]] | None:
        """Every queue on the broker, or ``[]`` where even the worst case fits (``None``: cannot tell).

        The queue count bounds the reservations in one cheap call; listing them all is slow.
        """
        total = self.api.queue_total()
        members = len(limits)
        if total is not None:
            worst = (total + adding) * (2 + members)
            budget = min(limits.values()) - RESERVED_FOR_OTHERS
            if worst <= budget - 2 * headroom(budget):  # sockets too: keep twice the headroom
                return []
        found: list[dict[str, Any]] | None = self.api.all_queues()
        return found

    def _node_handles(self) -> list[dict[str, Any]] | None:
        """Every running node's limits, waiting up to :data:`STATS_WAIT_S` for a new node's ``fd_total``.

        ``None``: cannot tell.
        """
        if self.api is None:
            return None
        deadline = time.monotonic() + STATS_WAIT_S
        while True:
            nodes: list[dict[str, Any]] | None = self.api.node_handles()
            if not nodes or all(isinstance(n.get("fd_total"), int) for n in nodes) or time.monotonic() > deadline:
                return nodes
            time.sleep(STATS_POLL_S)

    def _why_no_numbers(self) -> str:
        """Why the API gave no budget: switched off, another broker's, or not answering."""
        if self.api is None:
            return "delayq_management_url is ''"
        found = self.api.identity()
        if found.state == "other_broker":
            return (f"the management API at {self.api.base_url} answers for {found.how}, so it is not used (set "
                    "delayq_management_url to the API of a node of the broker in broker_url)")
        return (f"the management API at {self.api.base_url} did not answer for every node and virtual host (it "
                "needs the rabbitmq_management plugin and a user tagged monitoring or administrator)")

    @property
    def applies(self) -> bool:
        """Whether this broker reserves handles per quorum queue (RabbitMQ < 4.0)."""
        return self.version < RESERVATIONS_GONE_FROM

    def __call__(self, namespace: str, quorum_queues: int, *, what: str = "ladder") -> None:
        """Raise unless ``quorum_queues`` new quorum queues of ``namespace`` fit (``what`` names them).

        Raises:
            FileHandleBudgetExceeded: they would leave a node less than :func:`headroom`.
            FileHandleBudgetUnknown: the API cannot tell, and the creation is not explicit.
        """
        if not self.applies or quorum_queues <= 0:
            return
        version = ".".join(map(str, self.version))
        if self.api is not None and self.api.timeout < API_TIMEOUT_S:  # once per ladder: wait longer
            self.api = dataclasses.replace(self.api, timeout=API_TIMEOUT_S)
        nodes = self._node_handles()
        limits = {str(n["name"]): int(n["fd_total"]) for n in nodes or () if isinstance(n.get("fd_total"), int)}
        queues = self._queues(limits, quorum_queues) if limits else None
        if not limits or queues is None:
            if self.explicit:
                self.unchecked = (namespace, quorum_queues)
                return
            why = self.api_why or self._why_no_numbers()
            raise FileHandleBudgetUnknown(
                f"refusing to create {what} {namespace!r} implicitly on RabbitMQ {version}: its {quorum_queues} "
                f"quorum queues reserve {quorum_queues * 3} or more file handles on RabbitMQ 3.x, and the broker's "
                f"budget cannot be checked: {why}. At Debian's default open-files limit (1024) a node has ~927; "
                "past it, it silently stops accepting connections, for every app on it. Let delayq check it: "
                "enable the management plugin (`rabbitmq-plugins enable rabbitmq_management`) or set "
                "delayq_management_url; or, once you know it fits, create the ladder explicitly: "
                f"`celery -A APP delayq topology declare`. Otherwise {FIX}.")
        names = sorted(limits)
        reserved = quorum_reservations(queues, names)
        adds = ladder_reservations(quorum_queues, names, spread=self.spread and len(names) > 1)
        sockets = {str(n["name"]): int(n.get("sockets_used") or 0) for n in nodes or ()}
        for node in names:
            budget = max(1, limits[node] - RESERVED_FOR_OTHERS)
            used = reserved[node] + sockets.get(node, 0)
            if used + adds[node] > budget - headroom(budget):
                ladders = ladders_on(queues)
                shown = ", ".join(f"{name} {n}" for name, n in list(ladders.items())[:5])
                more = f" and {len(ladders) - 5} more" if len(ladders) > 5 else ""
                raise FileHandleBudgetExceeded(
                    f"refusing to create {what} {namespace!r} on RabbitMQ {version}: its {quorum_queues} quorum "
                    f"queues would reserve {adds[node]} file handles on {node}, which has {used} of its ~{budget} "
                    f"in use (open-files limit {limits[node]}; {headroom(budget)} kept for connections). Past "
                    "that budget RabbitMQ 3.x silently stops accepting connections, for every app on the broker. "
                    f"Ladders there now (level queues): {shown or 'none'}{more}. To fix: {FIX}.")
        log.info("delayq: %s %r fits RabbitMQ %s's file-handle budget (%s)", what, namespace, version,
                 ", ".join(f"{n} +{adds[n]} of {limits[n] - RESERVED_FOR_OTHERS}" for n in names))
