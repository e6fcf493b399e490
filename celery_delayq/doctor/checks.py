"""The doctor's checks as pure functions: plain observations in, a :class:`~.finding.Finding` out (unit-tested with data)."""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import datetime
from typing import Any, Iterable

from ..rabbitmq.budget import FIX, RESERVATIONS_GONE_FROM, RESERVED_FOR_OTHERS, quorum_reservations
from ..ladder.humanize import describe_ladder, human_duration
from ..ladder.spec import LadderSpec
from ..ladder.plugin_compat import PLUGIN_TYPE
from ..rabbitmq.topology import LadderState
from .finding import ACTIVATION_RULE, ERROR, OK, WARN, ApiReach, Finding

__all__ = [
    "broker_finding", "feature_flags_finding", "ladder_finding", "leaders_finding", "node_loss_finding",
    "file_handles_finding", "quorum_reservations", "parking_finding", "activation_finding", "worker_eta_finding",
    "native_finding", "plugin_finding", "native_queue_names", "REQUIRED_FLAGS", "NATIVE_LEVELS",
    "NATIVE_DELIVERY_EXCHANGE", "PLUGIN_GONE_FROM", "PLUGIN_MAX_DELAY_MS",
]

#: Feature flags the ladder's quorum queues need: quorum queues, and at-least-once dead-lettering.
REQUIRED_FLAGS = ("quorum_queue", "stream_queue")

#: Celery's native delayed delivery: ``celery_delayed_0`` .. ``celery_delayed_27``, 1 s unit.
NATIVE_LEVELS = 28
NATIVE_DELIVERY_EXCHANGE = "celery_delayed_delivery"

#: First RabbitMQ version on which the delayed-message plugin cannot run (no Mnesia).
PLUGIN_GONE_FROM = (4, 3)
#: The plugin's longest delay (Erlang's timer limit); longer ``x-delay`` values are delivered at once.
PLUGIN_MAX_DELAY_MS = 4_294_967_295


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def broker_finding(version: tuple[int, ...], queue_type: str) -> Finding:
    """Which RabbitMQ this is and what the ladder gets from it (``queue_type`` already resolved)."""
    shown = _version_text(version)
    details = {"version": shown, "queue_type": queue_type}
    if queue_type == "classic":
        why = ("this RabbitMQ has no message TTL on quorum queues (3.10+)" if version < (3, 10)
               else "delayq_queue_type = 'classic'")
        return Finding("broker", WARN, f"RabbitMQ {shown}: the ladder uses classic queues ({why}), whose "
                       "dead-lettering is at-most-once: a broker crash can lose a delayed message in flight.",
                       "Use quorum queues: RabbitMQ 3.10+ with delayq_queue_type 'auto' (the default).", details)
    upgrade = ("Nothing to do now. Before upgrading to 4.3+: drain the delayed-message plugin's exchanges if you "
               "use it (it cannot run there); 4.3 also recovers a ladder faster after a crash (3.10 to 4.2 can hold "
               "ladder messages up to 3 min)." if version < PLUGIN_GONE_FROM else "Nothing to do.")
    return Finding("broker", OK, f"RabbitMQ {shown}: the ladder uses quorum queues with at-least-once "
                   "dead-lettering.", upgrade, details)


def feature_flags_finding(flags: list[dict[str, Any]] | None, api: ApiReach) -> Finding:
    """The broker's feature flags (``GET /api/feature-flags``), or why they cannot be read."""
    if flags is None or not api.usable:
        unread = {"management_url": api.url, "api": api.state, "answered_for": api.answered_for}
        if api.usable:  # RabbitMQ 3.x lists them to the 'administrator' tag only
            return Finding("feature_flags", WARN, f"feature flags not checked: the management API at {api.url} did "
                           "not list them to this user (RabbitMQ 3.x shows them to users with the 'administrator' "
                           "tag only); the other checks use the API.",
                           f"Check them on a node: `rabbitmqctl list_feature_flags` (the ladder needs "
                           f"{', '.join(REQUIRED_FLAGS)} enabled).", unread)
        return Finding("feature_flags", WARN, f"feature flags not checked: {api.why_not()}; leaders and "
                       "plugin exchanges cannot be checked either.", api.how_to_fix(), unread)
    state = {str(f.get("name")): str(f.get("state")) for f in flags}
    disabled_required = [name for name in REQUIRED_FLAGS if state.get(name) != "enabled"]
    disabled_stable = sorted(str(f.get("name")) for f in flags
                             if f.get("state") != "enabled" and f.get("stability") in ("stable", "required"))
    details = {"management_url": api.url, "api": api.state,
               "enabled": sorted(n for n, s in state.items() if s == "enabled"),
               "disabled": sorted(n for n, s in state.items() if s != "enabled")}
    if disabled_required:
        names = ", ".join(disabled_required)
        return Finding("feature_flags", ERROR, f"feature flag(s) {names} disabled: quorum ladder queues with "
                       "at-least-once dead-lettering need them.",
                       f"Enable them: `rabbitmqctl enable_feature_flag {disabled_required[0]}`"
                       + (" (and the others)" if len(disabled_required) > 1 else "") + ".", details)
    if disabled_stable:
        return Finding("feature_flags", OK, f"{len(state)} feature flags, the ladder's ({', '.join(REQUIRED_FLAGS)}) "
                       f"enabled; {len(disabled_stable)} stable flag(s) disabled ({', '.join(disabled_stable)}).",
                       "Nothing to do for the ladder. Before upgrading RabbitMQ, enable every stable flag "
                       "(`rabbitmqctl enable_feature_flag all`): an upgrade refuses to start otherwise.", details)
    return Finding("feature_flags", OK, f"{len(state)} feature flags, all enabled.", "Nothing to do.", details)


def ladder_finding(state: LadderState, spec: LadderSpec, queue_type: str, *, declare: bool,
                   mismatch: str | None = None) -> Finding:
    """Is the app's ladder on the broker, complete, and declared with the app's arguments?"""
    described = describe_ladder(spec, queue_type)
    levels = {q.name for q in spec.level_queues()}
    waiting = sum(e.messages or 0 for e in state.entities if e.kind == "queue" and e.exists and e.name in levels)
    details: dict[str, Any] = {"prefix": spec.prefix, "namespace": spec.namespace, "exists": state.exists,
                               "complete": state.complete, "missing": [f"{e.kind} {e.name}" for e in state.missing],
                               "waiting": waiting, "max_delay_s": spec.max_delay_s, "mismatch": mismatch}
    if not state.exists:
        if declare:
            return Finding("ladder", WARN, f"no ladder on the broker yet (expected: {described}).",
                           "The app's first worker creates it when it starts, and the first delayed publish "
                           "before that; or create it now: `celery -A APP delayq topology declare`.", details)
        return Finding("ladder", ERROR, f"no ladder on the broker (expected: {described}), and delayq_declare is "
                       "False, so nothing will create it: delayed publishes will fail.",
                       "Have someone who may configure the vhost run `celery -A APP delayq topology declare`.",
                       details)
    routing = state.missing_for_routing(spec)
    if routing:
        missing = [f"{e.kind} {e.name}" for e in routing]
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return Finding("ladder", ERROR, f"{described} is incomplete: {len(missing)} missing ({shown}).",
                       "Run `celery -A APP delayq topology declare` (idempotent; it adds only what is missing).",
                       details)
    if mismatch:
        return Finding("ladder", ERROR, f"{described} exists with other arguments than the app's settings.",
                       mismatch, details)
    if state.missing:  # only the queues' entry exchanges: a ladder of 1.0.0rc1 or earlier
        return Finding("ladder", WARN, f"{described} has no entry exchanges ({len(state.missing)} missing): declared "
                       "by celery_delayq 1.0.0rc1 or earlier, it is entered through its level exchanges, whose match "
                       "of the routing key the broker confirms more slowly. Nothing is lost or late.",
                       "Run `celery -A APP delayq topology declare` (idempotent: it adds the entries and touches no "
                       "waiting task).", details)
    name = getattr(spec, "laps_queue", None)  # delays longer than the ladder: messages, and relays consuming them
    found = next((e for e in state.entities if e.kind == "queue" and e.name == name), None)
    details["laps"] = laps = {"queue": name, "exists": bool(found and found.exists),
                              "messages": (found.messages or 0) if found else 0,
                              "consumers": (found.consumers or 0) if found else 0}
    if laps["messages"] and not laps["consumers"]:
        return Finding("ladder", WARN, f"{described} is complete, but {laps['messages']:,} message(s) with delays "
                       f"longer than the ladder wait between laps in {laps['queue']!r} and no worker relays them.",
                       "Run at least one worker with the ladder installed (delayq_enabled, or "
                       "celery_delayq.install(app) in the worker): it puts them back into the ladder. They are "
                       "late until then, never lost.", details)
    between = f", {laps['messages']:,} between laps" if laps["messages"] else ""
    return Finding("ladder", OK, f"{described} is complete and matches the settings; {waiting:,} message(s) "
                   f"waiting{between}.", "Nothing to do.", details)


def leaders_finding(queues: list[dict[str, Any]] | None, nodes: list[str] | None, ladder_queues: Iterable[str],
                    api: ApiReach, *, vhost: str = "/", namespace: str = "") -> Finding:
    """Where the leaders of the ladder's queues run (``GET /api/queues`` and ``/api/nodes``); all on one node warns."""
    if queues is None or nodes is None or not api.usable:
        return Finding("leaders", WARN, f"leaders not checked: {api.why_not()}.", api.how_to_fix(),
                       {"api": api.state})
    wanted = set(ladder_queues)
    mine = [q for q in queues if q.get("name") in wanted]
    running = sorted(nodes)
    spread = dict(Counter(str(q.get("leader") or q.get("node") or "?") for q in mine))
    details: dict[str, Any] = {"nodes": running, "leaders": spread, "queues": len(mine)}
    if not mine:
        return Finding("leaders", OK, f"no ladder queues yet ({len(running)} node(s)).",
                       "Nothing to do until the ladder exists.", details)
    if len(running) <= 1:
        node = running[0] if running else next(iter(spread))
        return Finding("leaders", OK, f"single node ({node}): all {len(mine)} ladder queues lead there; "
                       "nothing to spread.", "Nothing to do.", details)
    classic = [q for q in mine if q.get("type") == "classic"]
    if classic:
        return Finding("leaders", WARN, f"{len(classic)} ladder queue(s) are classic on a {len(running)}-node "
                       "cluster: they live on one node each and are not replicated.",
                       "Use quorum queues (delayq_queue_type 'auto') and a new delayq_prefix; let the old ladder "
                       "drain, then delete it.", details)
    pattern = f"'^{re.escape(namespace + '.')}'" if namespace else "'^PREFIX'"
    vhost_pattern = f"'^{re.escape(vhost)}$'"
    want_members = min(3, len(running))
    short = [q for q in mine if len(q.get("members") or ()) < want_members]
    if len(spread) == 1:
        (node,) = spread
        return Finding("leaders", WARN, f"all {len(mine)} ladder queue leaders sit on {node}, one node of "
                       f"{len(running)}: it does every level's dead-letter work, and losing it moves them all at "
                       "once.",
                       f"Spread them: `rabbitmq-queues rebalance quorum --vhost-pattern {vhost_pattern} "
                       f"--queue-pattern {pattern}` (a 'balanced' leader locator alone balances the cluster's "
                       "total, not the ladder's).", details)
    if short:
        return Finding("leaders", WARN, f"{len(short)} ladder queue(s) have fewer than {want_members} replicas "
                       f"on a {len(running)}-node cluster.",
                       f"Add members: `rabbitmq-queues grow NODE all --vhost-pattern {vhost_pattern} "
                       f"--queue-pattern {pattern}` for each node that lacks them.", details)
    shown = ", ".join(f"{node} {n}" for node, n in sorted(spread.items()))
    return Finding("leaders", OK, f"{len(mine)} ladder queue leaders spread over {len(spread)} of "
                   f"{len(running)} nodes ({shown}).", "Nothing to do.", details)


#: First RabbitMQ whose quorum-queue client no longer asks the target's *first* member (down or
#: not) before a dead-letter worker's first publish to it (rabbitmq-server bd9f2a1396, in 3.12.5).
NODE_LOSS_FIXED_FROM = (3, 12, 5)
#: RabbitMQ's default ``dead_letter_worker_publisher_confirm_timeout`` (ms; advanced.config only).
DLX_CONFIRM_TIMEOUT_MS = 180_000
#: The value advised instead, and measured (benchmarks/results/faults.md, "At load").
DLX_CONFIRM_TIMEOUT_ADVISED_MS = 5_000


def node_loss_finding(version: tuple[int, ...], nodes: list[str] | None, queue_type: str,
                      api: ApiReach) -> Finding:
    """What losing one node of the cluster does to the tasks waiting in the ladder (docs/clusters.md).

    Before 3.12.5 a dead-letter worker's first publish to a target whose first member is down is
    rejected and re-sent only after ``dead_letter_worker_publisher_confirm_timeout``; only
    ``advanced.config`` shortens that.
    """
    shown = _version_text(version)
    timeout_s = DLX_CONFIRM_TIMEOUT_MS // 1000
    setting = (f"[{{rabbit, [{{dead_letter_worker_publisher_confirm_timeout, {DLX_CONFIRM_TIMEOUT_ADVISED_MS}}}]}}].")
    details: dict[str, Any] = {"version": shown, "nodes": nodes, "default_timeout_ms": DLX_CONFIRM_TIMEOUT_MS,
                               "advanced_config": setting}
    if queue_type != "quorum":
        return Finding("node_loss", OK, "classic ladder queues: no dead-letter worker holds messages (they are "
                       "dead-lettered at most once instead; see the broker check).", "Nothing to do here.", details)
    if nodes is None or not api.usable:
        return Finding("node_loss", OK, f"cannot tell whether this is a cluster: {api.why_not()}.",
                       api.how_to_fix(), details)
    if len(nodes) <= 1:
        return Finding("node_loss", OK, f"single node ({', '.join(nodes) or '?'}): no node loss to survive; a "
                       "restart makes tasks late by about the outage.", "Nothing to do.", details)
    if version >= NODE_LOSS_FIXED_FROM:
        return Finding("node_loss", OK, f"RabbitMQ {shown} on {len(nodes)} nodes: the ladder's dead-letter workers "
                       "fail over with their queues; tasks are late by about the outage.", "Nothing to do.", details)
    return Finding(
        "node_loss", WARN,
        f"RabbitMQ {shown} on {len(nodes)} nodes: when a node is lost, the ladder's dead-letter workers hold what "
        f"they were forwarding for {timeout_s} s (RabbitMQ's dead_letter_worker_publisher_confirm_timeout, unless "
        f"advanced.config sets it; the management API cannot show it) and up to {2 * timeout_s} s: most tasks "
        "waiting at the time arrive minutes late, none lost (measured on 3.10.8, kill -9 of one node of three "
        "with 5,000 tasks flowing: 4,361 more than 120 s late, the last 362 s). Nothing over AMQP or the "
        "management API moves them sooner (a policy touch does not: RabbitMQ re-sends a rejected message only "
        "after that timeout).",
        f"On every node, in advanced.config: `{setting}`, then restart the nodes one by one; tasks are then late "
        f"by about the outage (measured: the last 46 s late after a 58 s outage). Trade-off: a dead-letter "
        f"publish not confirmed within {DLX_CONFIRM_TIMEOUT_ADVISED_MS // 1000} s is sent again, so under a "
        "slow broker a task can arrive twice (Celery's delivery is at-least-once anyway; 6 of 5,000 arrived "
        "twice in the measurement, as with the default). Or upgrade RabbitMQ to 3.12.5 or later (4.0.5 and "
        "4.3.6 measured: late by about the outage).", details)


def file_handles_finding(version: tuple[int, ...], limits: dict[str, int] | None,
                         queues: list[dict[str, Any]] | None, api: ApiReach, *,
                         missing_ladder_queues: int = 0) -> Finding:
    """Will the node's quorum queues use up RabbitMQ 3.x's file-handle budget (docs/footprint.md)?

    ``missing_ladder_queues``: the ladder's queues a first start will add.
    """
    if version >= RESERVATIONS_GONE_FROM:
        return Finding("file_handles", OK, f"RabbitMQ {_version_text(version)} reserves no file handles per queue.",
                       "Nothing to do.", {"version": _version_text(version)})
    if limits is None or queues is None or not api.usable:
        return Finding("file_handles", WARN, f"quorum queue file-handle reservations not checked: {api.why_not()}.",
                       api.how_to_fix(), {"api": api.state})
    reserved = quorum_reservations(queues, limits)
    added = missing_ladder_queues * (2 + min(3, max(1, len(limits))))
    worst = max(limits, key=lambda n: (reserved[n] + added) / max(1, limits[n]))
    total, limit = reserved[worst] + added, limits[worst]
    budget = max(1, limit - RESERVED_FOR_OTHERS)
    details = {"limits": limits, "reserved": reserved, "ladder_queues_to_add": missing_ladder_queues}
    ratio = total / budget
    fix = (f"To fix: {FIX}; or delete other unused quorum queues. RabbitMQ 4.x reserves none.")
    where = f"{worst}: quorum queue replicas reserve {total} of its ~{budget} file handles (open-files limit {limit}"
    where += f", counting the {missing_ladder_queues} ladder queues still to declare)" if added else ")"
    if ratio >= 0.8:
        return Finding("file_handles", ERROR, f"{where}. Past the limit RabbitMQ 3.x silently stops accepting "
                       "connections (the node stays up; `rabbitmqctl status` hangs).", fix, details)
    if ratio >= 0.5:
        return Finding("file_handles", WARN, f"{where}: over half; a few more ladders or queues and RabbitMQ 3.x "
                       "silently stops accepting connections.", fix, details)
    return Finding("file_handles", OK, f"{where}.", "Nothing to do.", details)


def parking_finding(*, park: bool, name: str, exists: bool, messages: int | None, queue_type: str | None,
                    node: str | None, risk: str | None, version: tuple[int, ...]) -> Finding:
    """Where the parking queue is, what it holds, and whether a look at it can cost a message."""
    details = {"park": park, "queue": name, "exists": exists, "messages": messages, "queue_type": queue_type,
               "node": node, "browse_risk": risk, "version": _version_text(version)}
    if not park:
        return Finding("parking", OK, "parking is off (delayq_park = False): tasks whose retries are exhausted "
                       "fail as in plain Celery.", "Nothing to do.", details)
    if not exists:
        return Finding("parking", OK, f"parking queue {name!r} does not exist yet; it is created at the first park.",
                       "Nothing to do.", details)
    where = " ".join(p for p in (queue_type, f"on {node}" if node else None) if p)
    where = f" ({where})" if where else ""
    if risk:
        return Finding("parking", WARN, f"parking queue {name!r}{where}, {messages or 0:,} parked: {risk}.",
                       f"Recreate it without a delivery limit, keeping every message: "
                       f"ParkingQueue.for_app(app, {name!r}).redeclare(); or upgrade to RabbitMQ 4.3+, where a "
                       "look does not count. Until then `delayq parking list` refuses to read it.", details)
    limit = ("a look never counts as a delivery (4.3+)" if version >= (4, 3)
             else "no delivery limit, so looking at it is safe")
    return Finding("parking", OK, f"parking queue {name!r}{where}: {messages or 0:,} parked; {limit}.",
                   "See them with `celery -A APP delayq parking list`." if messages else "Nothing to do.", details)


def activation_finding(*, enabled: bool, installed: bool, ladder_tasks: int = 0,
                       plain_process: dict[str, Any] | None = None) -> Finding:
    """Is the ladder really active: in this process, and in a process that only imports the app.

    ``plain_process``: a fresh interpreter's answer (``imports_celery_delayq``, ``installed``, ``error``).
    """
    details = {"delayq_enabled": enabled, "installed_here": installed, "ladder_tasks": ladder_tasks,
               "plain_process": plain_process, "rule": ACTIVATION_RULE}
    if not enabled:
        only = (f"; only the {ladder_tasks} DelayedRetryTask task(s) use the ladder" if ladder_tasks else "")
        return Finding("activation", WARN, f"delayq_enabled is off: countdown, eta and retry publishes of plain "
                       f"tasks are held by workers as ETAs{only}.",
                       "Set delayq_enabled = True (Django: CELERY_DELAYQ_ENABLED = True) and run the doctor again. "
                       + ACTIVATION_RULE, details)
    if not installed:
        return Finding("activation", ERROR, "delayq_enabled is set, but the ladder hook is not installed in this "
                       "process: its delayed publishes would be held by workers.",
                       "Import celery_delayq before the app's first publish, or call celery_delayq.install(app). "
                       + ACTIVATION_RULE, details)
    if plain_process is not None:
        if plain_process.get("error"):
            return Finding("activation", WARN, "delayq_enabled is on and active here, but a fresh process could not "
                           f"import the app to check it: {plain_process['error']}.",
                           "Run the doctor from the directory your processes start in. " + ACTIVATION_RULE, details)
        if not plain_process.get("installed"):
            why = ("never imports celery_delayq" if not plain_process.get("imports_celery_delayq")
                   else "imports celery_delayq but the hook was not installed")
            return Finding("activation", WARN, "delayq_enabled is on and active here (the delayq command imported "
                           f"celery_delayq), but a process that only imports the app {why}: its delayed publishes "
                           "reach the ladder only through a worker, which moves them there on arrival.",
                           "Add `import celery_delayq` next to the app's definition (Django: 'celery_delayq.django' "
                           "in INSTALLED_APPS). " + ACTIVATION_RULE, details)
        return Finding("activation", OK, "delayq_enabled is on, and the ladder is active in this process and in a "
                       "fresh process that only imports the app.", "Nothing to do.", details)
    return Finding("activation", OK, "delayq_enabled is on and the ladder is active in this process.",
                   "Nothing to do; make sure every process that publishes imports celery_delayq. " + ACTIVATION_RULE,
                   details)


def _eta_of(item: dict[str, Any]) -> float | None:
    if not (eta := item.get("eta")):
        return None
    try:
        return datetime.fromisoformat(str(eta)).timestamp()
    except ValueError:
        return None


def worker_eta_finding(replies: dict[str, list[dict[str, Any]]] | None, *, enabled: bool, timeout: float,
                       now: float | None = None) -> Finding:
    """The tasks workers hold in memory as classic ETAs (``inspect().scheduled()``)."""
    now = time.time() if now is None else now
    if not replies:
        return Finding("worker_eta", WARN, f"no worker answered `inspect scheduled` within {timeout:g} s, so "
                       "held ETA tasks cannot be counted (with no worker running, none is held).",
                       "Start a worker or raise --timeout, then run the doctor again.", {"workers": {}})
    per_worker = {name: len(items or ()) for name, items in replies.items()}
    etas = sorted(e for items in replies.values() for e in (_eta_of(i) for i in items or ()) if e is not None)
    names = dict(Counter(str((i.get("request") or {}).get("name") or "?") for items in replies.values()
                         for i in items or ()))
    held = sum(per_worker.values())
    details: dict[str, Any] = {"workers": per_worker, "held": held, "tasks": names,
                               "first_eta": etas[0] if etas else None, "last_eta": etas[-1] if etas else None}
    if not held:
        return Finding("worker_eta", OK, f"{len(per_worker)} worker(s) answered; none holds an ETA task.",
                       "Nothing to do.", details)
    first, last = (human_duration(max(0.0, e - now)) for e in (etas[0], etas[-1])) if etas else ("", "")
    span = "" if not etas else f", due in {first}" if first == last else f", due in {first} to {last}"
    summary = f"{held:,} task(s) held in memory by {sum(1 for n in per_worker.values() if n)} worker(s) as ETAs{span}."
    what = ("They still run, exactly once, at their eta: a worker acknowledges an ETA message only when it runs it, "
            "and a warm shutdown (SIGTERM) hands held messages back to the queue, where the next worker holds them "
            "again. Restart workers with SIGTERM, not SIGKILL in the middle of a task. Give the restarted workers "
            f"a prefetch of at least {max(per_worker.values())} (worker_prefetch_multiplier x concurrency): with "
            "fewer slots than held ETAs a worker fetches nothing else from that queue until one comes due "
            "(celery#2731). ")
    return Finding("worker_eta", WARN, summary, what + (
        "New ETAs should not appear once every publisher has the ladder: if the count grows, some process publishes "
        "without celery_delayq (see the activation finding)." if enabled
        else "Turn delayq_enabled on so new delays wait in the broker instead."), details)


def native_queue_names() -> list[str]:
    """Celery's native delayed-delivery queues, top level first (``celery_delayed_27`` .. ``_0``)."""
    return [f"celery_delayed_{k}" for k in range(NATIVE_LEVELS - 1, -1, -1)]


def native_finding(queues: dict[str, int | None], *, delivery_exchange: bool, quorum_app: bool,
                   enabled: bool, now: float | None = None) -> Finding:
    """Celery's own delayed delivery (``celery_delayed_*``): present, in use, and when it will be empty.

    ``queues``: each existing native queue's ready messages (``celery_delayed_k``: within ``2**(k+1) - 1`` s).
    """
    now = time.time() if now is None else now
    busy = {name: n for name, n in queues.items() if n}
    total = sum(busy.values())
    levels = [int(name.rsplit("_", 1)[1]) for name in busy]
    bound = (2 ** (max(levels) + 1) - 1) if levels else None
    details: dict[str, Any] = {"queues": len(queues), "delivery_exchange": delivery_exchange, "messages": total,
                               "busy": busy, "empty_within_s": bound, "quorum_queue_in_app": quorum_app}
    if not queues and not delivery_exchange:
        active = (" (it would be, for tasks sent to a non-direct exchange: the app has a quorum queue)"
                  if quorum_app and not enabled else "")
        return Finding("native_delayed_delivery", OK, f"Celery's native delayed delivery is not in use here{active}.",
                       "Nothing to do.", details)
    if total:
        by = datetime.fromtimestamp(now + (bound or 0)).astimezone().isoformat(timespec="seconds")
        return Finding("native_delayed_delivery", WARN,
                       f"{total:,} message(s) wait in Celery's native delayed-delivery queues "
                       f"({', '.join(sorted(busy, key=lambda n: -int(n.rsplit('_', 1)[1]))[:3])}); they still arrive, "
                       f"all within {human_duration(bound or 0)} (by {by}).",
                       "Keep the celery_delayed_* exchanges, queues and bindings until they are empty (workers with a "
                       "quorum queue in task_queues keep declaring them); the ladder takes every new delayed publish "
                       "meanwhile" + ("" if enabled else " once delayq_enabled is on") + ".", details)
    return Finding("native_delayed_delivery", OK, f"Celery's native delayed-delivery queues exist "
                   f"({len(queues)} of {NATIVE_LEVELS}) and are empty.",
                   ("Nothing to do: with the ladder on, new delayed publishes skip them. Celery's workers re-declare "
                    "them while a quorum queue is configured, so deleting them is pointless.") if enabled else
                   "Nothing to do; with delayq_enabled on, new delayed publishes skip them.", details)


def plugin_finding(exchanges: list[dict[str, Any]] | None, *, plugin_enabled: bool | None,
                   version: tuple[int, ...], api: ApiReach) -> Finding:
    """Exchanges of the delayed-message plugin's type (``GET /api/exchanges``), and what they still hold
    (``messages_delayed``: lost by disabling the plugin or upgrading to 4.3+)."""
    if exchanges is None or not api.usable:
        return Finding("plugin_exchanges", WARN, f"plugin exchanges not checked: {api.why_not()} (AMQP cannot tell "
                       "an exchange's type).", api.how_to_fix(), {"api": api.state})
    mine = [x for x in exchanges if x.get("type") == PLUGIN_TYPE]
    counts = {str(x.get("name")): x.get("messages_delayed") for x in mine}
    held = sum(int(n) for n in counts.values() if isinstance(n, int))
    unknown = [name for name, n in counts.items() if not isinstance(n, int)]
    details = {"plugin_enabled": plugin_enabled, "exchanges": counts, "messages_delayed": held,
               "version": _version_text(version)}
    if not mine:
        if plugin_enabled:
            return Finding("plugin_exchanges", OK, "the delayed-message plugin is enabled but no exchange of its type "
                           "is in this vhost.",
                           "Disable it before upgrading to RabbitMQ 4.3+, where it cannot run "
                           "(`rabbitmq-plugins disable rabbitmq_delayed_message_exchange`), once no vhost uses it.",
                           details)
        return Finding("plugin_exchanges", OK, "no delayed-message-plugin exchanges.", "Nothing to do.", details)
    names = ", ".join(sorted(counts)[:3]) + (f" and {len(counts) - 3} more" if len(counts) > 3 else "")
    waiting = (f"{held:,} message(s) still delayed in them" if not unknown
               else f"{held:,} message(s) known to be delayed, {len(unknown)} exchange(s) that do not say")
    drain = ("Switch the publishers first: with delayq_enabled on, their x-delay publishes wait in the ladder "
             "instead. Then wait out the longest x-delay still held (messages_delayed 0 on every exchange), delete "
             "the plugin's exchanges and disable the plugin, and only then upgrade: disabling the plugin deletes "
             "every message it still holds.")
    if version >= PLUGIN_GONE_FROM or plugin_enabled is False:
        return Finding("plugin_exchanges", ERROR, f"{len(mine)} exchange(s) of the delayed-message plugin's type "
                       f"({names}) on a broker where the plugin does not run: nothing publishes through them.",
                       "Delete them and publish through the ladder (x-delay keeps working with delayq_enabled on); "
                       "messages the plugin held before are gone.", details)
    status = WARN if held or unknown else OK
    return Finding("plugin_exchanges", status, f"{len(mine)} delayed-message-plugin exchange(s) ({names}): {waiting}.",
                   drain, details)
