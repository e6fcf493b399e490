"""What the doctor looks at, read-only: passive declares, management API GETs, ``inspect scheduled``.

Creates nothing: the only non-passive declares (``verify`` of a complete ladder, the parking
queue's limit probe) repeat existing arguments. :func:`classify` makes findings without I/O.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import TopologyMismatch
from ..glue.app_ladder import AppLadder
from ..ladder.spec import LadderSpec
from ..rabbitmq.management import ManagementAPI
from ..ladder.plugin_compat import PLUGIN_TYPE
from ..rabbitmq.topology import LadderState, Topology, resolve_queue_type
from ..rabbitmq.client import Connection, broker_version
from ..rabbitmq.budget import RESERVATIONS_GONE_FROM
from ..rabbitmq.probe import exchange_exists, queue_depth
from .checks import (
    NATIVE_DELIVERY_EXCHANGE, activation_finding, broker_finding, feature_flags_finding,
    file_handles_finding, ladder_finding, leaders_finding, native_finding, node_loss_finding, native_queue_names, parking_finding,
    plugin_finding, worker_eta_finding,
)
from .finding import ApiReach, Finding

__all__ = ["Observations", "observe", "classify", "diagnose", "probe_plain_process"]

_T = TypeVar("_T")


@dataclass
class Observations:
    """Everything the doctor looked at, as plain data (``classify`` turns it into findings)."""

    version: tuple[int, ...]
    queue_type: str
    spec: LadderSpec
    declare: bool
    ladder: LadderState
    mismatch: str | None
    api: ApiReach
    vhost: str
    flags: list[dict[str, Any]] | None
    nodes: list[str] | None
    fd_limits: dict[str, int] | None
    all_queues: list[dict[str, Any]] | None
    api_queues: list[dict[str, Any]] | None
    exchanges: list[dict[str, Any]] | None
    plugin_enabled: bool | None
    park: bool
    parking_queue: str
    parking_exists: bool
    parking_messages: int | None
    parking_risk: str | None
    enabled: bool
    installed: bool
    ladder_tasks: int
    plain_process: dict[str, Any] | None
    scheduled: dict[str, list[dict[str, Any]]] | None
    inspect_timeout: float
    native: dict[str, int | None]
    native_delivery: bool
    quorum_app: bool


class _DoctorAPI(ManagementAPI):
    """The management API GETs the doctor needs beyond :class:`ManagementAPI`'s."""

    def get(self, path: str, kind: type[_T]) -> _T | None:
        """The answer to ``GET path`` when it is a ``kind`` (a list, a dict), else ``None``."""
        found = self._get(path)
        return found if isinstance(found, kind) else None

    def vhost_path(self, kind: str) -> str:
        return f"/api/{kind}/{urllib.parse.quote(self.vhost, safe='')}"


def _reach(api: _DoctorAPI | None, raw: Connection) -> tuple[ApiReach, dict[str, Any] | None]:
    """Ask the API's overview, checked to speak for the AMQP connection's broker (:meth:`ManagementAPI.identify`)."""
    if api is None:
        return ApiReach(None, "off"), None
    found = api.identity()
    if found.state in ("unreachable", "other_broker"):
        return ApiReach(api.base_url, found.state, found.how), None
    return ApiReach(api.base_url, "ok", f"cluster {found.api_cluster} (matched by {found.how})"), \
        api.get("/api/overview", dict)


_PROBE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
out = {"imports_celery_delayq": False, "installed": False, "error": None}
try:
    if os.environ.get("DJANGO_SETTINGS_MODULE"):
        import django
        django.setup()
    from celery.app.utils import find_app
    app = find_app(sys.argv[1])
    app.conf.get("broker_url")  # load the configuration, as the first publish does
    out["imports_celery_delayq"] = "celery_delayq" in sys.modules
    if out["imports_celery_delayq"]:
        from celery_delayq.glue.integration import is_installed
        out["installed"] = is_installed(app)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def probe_plain_process(app_spec: str, *, timeout: float = 60.0) -> dict[str, Any]:
    """Import the app as ``-A app_spec`` would, in a fresh interpreter, and report whether the ladder is on there.

    The doctor's own process has imported celery_delayq (the ``delayq``
    command lives in it), so it cannot show what a web process that only
    imports the app does. The child inherits the environment and the
    working directory, as a process started beside this one would.
    """
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, app_spec], capture_output=True, text=True,
                              timeout=timeout, cwd=os.getcwd(), env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"imports_celery_delayq": False, "installed": False,
                "error": f"importing {app_spec!r} took over {timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"imports_celery_delayq": False, "installed": False, "error": tail}
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def observe(ladder: AppLadder, raw: Connection, *, inspect_timeout: float = 1.0,
            app_spec: str | None = None) -> Observations:
    """Look at everything the checks need. Creates nothing on the broker (see the module docstring).

    Args:
        ladder: The app's ladder (its settings and broker; nothing is hooked).
        raw: A connected py-amqp connection to the ladder's broker.
        inspect_timeout: Seconds to wait for workers' ``inspect scheduled`` replies.
        app_spec: The ``-A`` value, to probe a fresh process that only imports the app (``None``: skip).
    """
    from ..glue.integration import enabled_in, is_installed

    app, config, connection = ladder.app, ladder.config, ladder.connection()
    parking_queue = config.parking_queue_name
    version = broker_version(raw)
    spec = config.spec
    queue_type = resolve_queue_type(config.queue_type, version)
    topo = Topology(spec, queue_type)
    state = topo.inspect(raw)
    mismatch = None
    if state.exists and not state.missing_for_routing(spec):
        try:
            topo.verify(raw)  # every entity exists: a same-argument redeclare changes nothing
        except TopologyMismatch as exc:
            mismatch = str(exc)

    base = ManagementAPI.for_broker(connection, raw, config.management_url)
    api = None if base is None else _DoctorAPI(base.base_url, base.vhost, base.userid, base.password, base.timeout,
                                               base.cluster_name, base.connection_name, base.configured)
    reach, overview = _reach(api, raw)
    flags = nodes = api_queues = exchanges = fd_limits = all_queues = None
    plugin_enabled = None
    if api is not None and reach.usable:
        flags = api.get("/api/feature-flags", list)
        found_nodes = api.get("/api/nodes?columns=name,running,fd_total", list)
        nodes = None if found_nodes is None else [str(n["name"]) for n in found_nodes if n.get("running", True)]
        if found_nodes is not None and version < RESERVATIONS_GONE_FROM:
            fd_limits = {str(n["name"]): int(n["fd_total"]) for n in found_nodes
                         if n.get("running", True) and isinstance(n.get("fd_total"), int)} or None
            all_queues = api.get("/api/queues?columns=type,node,leader,members", list)  # every vhost
        api_queues = api.get(api.vhost_path("queues") + "?columns=name,type,node,leader,members,messages", list)
        exchanges = api.get(api.vhost_path("exchanges"), list)
        types = (overview or {}).get("exchange_types")
        if isinstance(types, list):
            plugin_enabled = any(t.get("name") == PLUGIN_TYPE for t in types if isinstance(t, dict))

    parking_messages = queue_depth(raw, parking_queue)
    risk = None
    if parking_messages is not None and config.park:
        from ..parking.limits import browse_risk

        risk = browse_risk(raw, parking_queue, version)  # an existing queue: nothing is created

    native: dict[str, int | None] = {
        name: n for name in native_queue_names() if (n := queue_depth(raw, name)) is not None}
    enabled = enabled_in(app)
    installed = is_installed(app)
    ladder_tasks = len(ladder.tasks)
    plain = probe_plain_process(app_spec) if app_spec and enabled and installed else None
    try:
        scheduled = app.control.inspect(timeout=inspect_timeout).scheduled()
    except Exception:  # noqa: BLE001 - a broken control channel is reported as "no reply"
        scheduled = None
    return Observations(
        version=version, queue_type=queue_type, spec=spec, declare=config.declare, ladder=state, mismatch=mismatch,
        api=reach, vhost=connection.virtual_host or "/", flags=flags, nodes=nodes, api_queues=api_queues,
        fd_limits=fd_limits, all_queues=all_queues,
        exchanges=exchanges, plugin_enabled=plugin_enabled, park=config.park, parking_queue=parking_queue,
        parking_exists=parking_messages is not None, parking_messages=parking_messages, parking_risk=risk,
        enabled=enabled, installed=installed, ladder_tasks=ladder_tasks, plain_process=plain, scheduled=scheduled,
        inspect_timeout=inspect_timeout, native=native,
        native_delivery=exchange_exists(raw, NATIVE_DELIVERY_EXCHANGE),
        quorum_app=any((getattr(q, "queue_arguments", None) or {}).get("x-queue-type") == "quorum"
                       for q in app.amqp.queues.values()))


def classify(obs: Observations, *, now: float | None = None) -> list[Finding]:
    """Every finding for ``obs``, in :data:`CHECKS` order (pure)."""
    spec = obs.spec
    ladder_queues = [q.name for q in spec.level_queues()]
    parking_row = next((q for q in obs.api_queues or () if q.get("name") == obs.parking_queue), {})
    listed = {q.get("name") for q in obs.api_queues or ()}  # level queues not listed yet: a first start adds them
    missing = (sum(q not in listed for q in ladder_queues)
               if obs.queue_type == "quorum" and obs.api_queues is not None else 0)
    return [
        broker_finding(obs.version, obs.queue_type),
        feature_flags_finding(obs.flags, obs.api),
        ladder_finding(obs.ladder, spec, obs.queue_type, declare=obs.declare, mismatch=obs.mismatch),
        leaders_finding(obs.api_queues, obs.nodes, ladder_queues, obs.api, vhost=obs.vhost, namespace=spec.namespace),
        node_loss_finding(obs.version, obs.nodes, obs.queue_type, obs.api),
        file_handles_finding(obs.version, obs.fd_limits, obs.all_queues, obs.api, missing_ladder_queues=missing),
        parking_finding(park=obs.park, name=obs.parking_queue, exists=obs.parking_exists,
                        messages=obs.parking_messages, queue_type=parking_row.get("type"),
                        node=parking_row.get("leader") or parking_row.get("node"), risk=obs.parking_risk,
                        version=obs.version),
        activation_finding(enabled=obs.enabled, installed=obs.installed, ladder_tasks=obs.ladder_tasks,
                           plain_process=obs.plain_process),
        worker_eta_finding(obs.scheduled, enabled=obs.enabled, timeout=obs.inspect_timeout, now=now),
        native_finding(obs.native, delivery_exchange=obs.native_delivery, quorum_app=obs.quorum_app,
                       enabled=obs.enabled, now=now),
        plugin_finding(obs.exchanges, plugin_enabled=obs.plugin_enabled, version=obs.version, api=obs.api),
    ]


def diagnose(ladder: AppLadder, raw: Connection, *, inspect_timeout: float = 1.0,
             app_spec: str | None = None) -> list[Finding]:
    """Observe (read-only) and classify: the doctor's findings for the ladder's app."""
    return classify(observe(ladder, raw, inspect_timeout=inspect_timeout, app_spec=app_spec))
