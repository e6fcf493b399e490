"""RabbitMQ 3.x's file-handle budget: a new ladder is created only where it fits.

On RabbitMQ before 4.0 every quorum queue replica *reserves* file handles in
the node's ``file_handle_cache``: ``2 + members`` on the leader, 2 on each
follower. The reservation is always granted but counts against the node's
limit (its open-files limit, ``ulimit -n``, less about 100), and so do the
sockets of client connections. Past that limit the node keeps running but
accepts no new connection, for every client and every virtual host, answers
no ``rabbitmqctl status``, raises no alarm and logs nothing.

Measured on a private 3.10.8 node at Debian's default ``ulimit -n`` 1024
(``python -m benchmarks.faults.handles``; ``docs/footprint.md``): the cache's
limit is 927; a quorum queue reserves 3, a stream, a classic queue or an
exchange 0 (a stream holds 2 real descriptors, outside the cache); one default
ladder (43 quorum queues: 42 levels and the unroutable queue) reserves 129,
each exit queue 3 more. Seven ladders fit; the eighth wedged the node.
RabbitMQ 4.x has no file-handle cache and reserves nothing: nothing here
applies to it.

So before a process declares a *new* ladder (or new shards) on 3.x:

* with the management API (a user tagged ``monitoring`` or ``administrator``,
  who sees every virtual host): the reservations of every quorum queue on
  the broker are counted per node (:func:`quorum_reservations`), plus its
  sockets in use, plus the new ladder's (:func:`ladder_reservations`); where
  that would leave less than :func:`headroom` for connections, the ladder is
  refused with :class:`~celery_delayq.errors.FileHandleBudgetExceeded`;
* without it (Debian ships the management plugin off), the process cannot
  tell, so it does not create a new ladder implicitly: a publish or a worker
  start raises :class:`~celery_delayq.errors.FileHandleBudgetUnknown`, and an
  operator creates it explicitly (``celery -A APP delayq topology declare``),
  or enables the API so the check can run. An existing ladder needs neither.

Why not a smaller ladder instead: its reservations are its 42 level queues
(the shape's digits, radix 4 x 14 levels, measured twice as fast as binary),
which must be quorum queues for at-least-once dead-lettering; everything
else a ladder owns reserves nothing but the unroutable queue (3). The index
streams reserve nothing on 3.10 (2 real descriptors each). A smaller ladder
would only move the wall from the 8th ladder to the 10th; a check removes it.

The arithmetic is pure; :class:`BudgetCheck` asks the API.
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
    """File handles each node's quorum queue replicas reserve on RabbitMQ 3.x (pure).

    ``rabbit_quorum_queue`` reserves ``2 + members`` for a leader and 2 for a
    follower (``file_handle_leader_reservation``/``_other_reservation``);
    ``queues`` are ``GET /api/queues`` rows (``type``, ``leader``/``node``,
    ``members``) of every virtual host.
    """
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
    """What ``quorum_queues`` new quorum queues reserve on each node (pure).

    RabbitMQ 3.x makes every running node a member of a new quorum queue.
    Leaders go round robin when ``spread`` (:mod:`celery_delayq.rabbitmq.placement`),
    else all on the first node (the declaring one: the broker's client-local
    default), which is the worst case for it.
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
        explicit: An operator's explicit ``topology declare``: without the API
            the ladder is created anyway (the caller shows the cost), never refused.
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

        Listing every queue of every vhost took 0.3 s for 300 queues here, on a
        path a first publish waits for; the broker's queue count bounds the
        reservations (``2 + members`` each at most) in one cheap call, and a
        broker with a raised limit never needs more.
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
        """Every running node's limits, waiting for them on a node just started (``None``: cannot tell).

        A node's ``fd_total`` comes with its first statistics emission
        (``collect_statistics_interval``, 5 s by default): a node that has just
        started lists itself without it for about 4.5 s (measured on 3.10.8).
        A process started beside the broker (a compose file, a CI job) would be
        refused its ladder for that, so the check waits up to
        :data:`STATS_WAIT_S` for every node's numbers.
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
        """Raise unless ``quorum_queues`` new quorum queues of ladder ``namespace`` fit.

        ``what`` names the queues in the messages (a ladder, or a fixed-delay queue).

        Raises:
            FileHandleBudgetExceeded: they would leave the node(s) less than
                :func:`headroom` for connections.
            FileHandleBudgetUnknown: the API cannot tell, and the creation is
                not explicit.
        """
        if not self.applies or quorum_queues <= 0:
            return
        version = ".".join(map(str, self.version))
        if self.api is not None and self.api.timeout < API_TIMEOUT_S:
            # Once per new ladder, so wait longer than a publish-path call would: a node
            # just started, or busy, can take seconds to answer (a refusal would be wrong).
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
