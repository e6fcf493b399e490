"""What AMQP cannot tell (bindings, messages held in dead-letter state), asked of RabbitMQ's management API.

The API is optional: every call answers ``None`` ("cannot tell") when it is off or
unreachable, quickly, and callers fall back to what AMQP can do. Stdlib only.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.parse
import time
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import amqp
    from kombu.connection import Connection

__all__ = ["ManagementAPI", "Identity", "amqp_identity", "default_name_of", "key_matches", "report_unused",
           "split_credentials"]

log = logging.getLogger(__name__)

#: The management plugin's default port.
DEFAULT_PORT = 15672
#: How long the API may take to list a new AMQP connection (a node emits statistics every 5 s).
CONNECTION_VISIBLE_S = 6.0


def key_matches(exchange_type: str, binding_key: str, routing_key: str) -> bool | None:
    """Does a binding with ``binding_key`` route ``routing_key``? ``None``: headers or plugin types (pure)."""
    if exchange_type == "fanout":
        return True
    if exchange_type == "direct":
        return binding_key == routing_key
    if exchange_type == "topic":
        return _topic_match(binding_key.split("."), routing_key.split("."))
    return None


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``(url without user info, user, password)``, percent-decoded; ``None`` for both when ``url`` has none (pure).

    A user without a password gives ``""``. urllib cannot open a URL with user info.
    """
    head, sep, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    user_info, at, host = authority.rpartition("@")
    if not sep or not at:
        return url, None, None
    user, colon, password = user_info.partition(":")
    return (f"{head}{sep}{host}{slash}{tail}", urllib.parse.unquote(user),
            urllib.parse.unquote(password) if colon else "")


def _topic_match(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_topic_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _topic_match(rest, words[1:])


@dataclass(frozen=True, eq=False)
class ManagementAPI:
    """A client of one vhost's management API; every method answers ``None`` when it cannot tell."""

    #: Never holds credentials (:func:`split_credentials`), so it is safe to print and log.
    base_url: str
    vhost: str
    userid: str
    password: str = field(repr=False)
    timeout: float = 2.0
    #: The AMQP connection's ``cluster_name``: an API of another broker must never answer for this one.
    cluster_name: str | None = None
    #: The AMQP connection as the broker names it (``"client_ip:port -> server_ip:port"``).
    connection_name: str | None = None
    #: Was the URL given (``delayq_management_url``) rather than guessed from the AMQP host?
    configured: bool = False

    @classmethod
    def for_connection(cls, connection: Connection, url: str | None = None, *, cluster_name: str | None = None,
                       connection_name: str | None = None) -> "ManagementAPI | None":
        """The API of a kombu connection's broker: ``url``, else ``http://<host>:15672``; ``url=""`` = off.

        Credentials in ``url`` (``http://monitor:secret@host:15672``) are used instead of the AMQP
        connection's and kept out of :attr:`base_url`. ``cluster_name`` and ``connection_name``
        identify the broker the AMQP side reached (:attr:`same_broker`).
        """
        if url == "":
            return None
        configured = url is not None
        url = url or f"http://{connection.hostname or 'localhost'}:{DEFAULT_PORT}"
        base, userid, password = split_credentials(url)
        if userid is None:
            userid, password = connection.userid or "guest", connection.password or "guest"
        return cls(base.rstrip("/"), connection.virtual_host or "/", userid, password or "",
                   cluster_name=cluster_name, connection_name=connection_name, configured=configured)

    @classmethod
    def for_broker(cls, connection: Connection, raw: amqp.Connection, url: str | None = None) -> "ManagementAPI | None":
        """:meth:`for_connection`, checked against the broker the open ``raw`` reached (:func:`amqp_identity`)."""
        cluster, name = amqp_identity(raw)
        return cls.for_connection(connection, url, cluster_name=cluster, connection_name=name)

    @property
    def same_broker(self) -> bool:
        """Does this API speak for the broker the AMQP connection reached? (:meth:`identity`)"""
        return self.identity().state == "ok"

    def identity(self) -> "Identity":
        """:meth:`identify`, asked once (no answer is not kept); an unused API is reported (:func:`report_unused`)."""
        known = self.__dict__.get("_identity")
        if isinstance(known, Identity):
            return known
        found = self.identify()
        if found.state != "ok":
            report_unused(self, found)
        if found.state != "unreachable":
            self.__dict__["_identity"] = found
        return found

    def identify(self, *, wait_s: float = CONNECTION_VISIBLE_S) -> "Identity":
        """Whether this API speaks for the broker of the AMQP connection, and by what sign.

        The first that holds: 1. ``/api/overview``'s ``cluster_name`` is the AMQP connection's;
        2. the AMQP ``cluster_name`` is RabbitMQ 3.x's default name of one of ``/api/nodes``
        (``<node>@<FQDN>``); 3. (several nodes only) the AMQP connection is among the API's, asked for up to
        ``wait_s`` (it shows after the next statistics emission). Otherwise the API belongs to another broker.
        """
        overview, failure = self._fetch("/api/overview?columns=cluster_name,node,rabbitmq_version")
        if not isinstance(overview, dict):
            return Identity("unreachable", failure or f"no usable answer from {self.base_url}")
        theirs = str(overview.get("cluster_name") or "")
        if not self.cluster_name or theirs == self.cluster_name:
            return Identity("ok", "cluster_name", theirs)
        nodes = self._fetch("/api/nodes?columns=name")[0]
        names = [str(n.get("name")) for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []
        if default_name_of(self.cluster_name, names, api_node=str(overview.get("node") or ""), api_cluster=theirs):
            return Identity("ok", "node", theirs)
        # A single node answers AMQP and HTTP with one cluster_name: no need to wait for the connection.
        if len(names) != 1 and self.connection_name and self._sees_connection(self.connection_name, wait_s):
            return Identity("ok", "connection", theirs)
        return Identity("other_broker", f"cluster {theirs!r} (nodes {', '.join(names) or '?'}), RabbitMQ "
                        f"{overview.get('rabbitmq_version') or '?'}; the AMQP connection reached cluster "
                        f"{self.cluster_name!r}, which none of its nodes is", theirs)

    def _sees_connection(self, name: str, wait_s: float) -> bool:
        path = "/api/connections/" + urllib.parse.quote(name, safe="") + "?columns=name"
        deadline = time.monotonic() + wait_s
        while True:
            found = self._fetch(path)[0]
            if isinstance(found, dict):
                return True
            if found is None or time.monotonic() >= deadline:  # None: the API failed, not "not there"
                return False
            time.sleep(0.5)

    def _get(self, path: str) -> Any:
        return self._fetch(path)[0] if self.same_broker else None

    def _rows(self, path: str) -> list[dict[str, Any]] | None:
        """The objects of a listing answer (``GET`` of a collection); ``None`` when the API cannot tell."""
        found = self._get(path)
        return [row for row in found if isinstance(row, dict)] if isinstance(found, list) else None

    def _http(self, path: str, data: bytes | None = None, method: str | None = None) -> urllib.request.Request:
        token = base64.b64encode(f"{self.userid}:{self.password}".encode()).decode()
        return urllib.request.Request(self.base_url + path, data, {"Authorization": f"Basic {token}"}, method=method)

    def _fetch(self, path: str) -> tuple[Any, str]:
        """The decoded answer (``None``: unusable, ``_NOT_FOUND``: 404) and, when unusable, why, for the operator."""
        request = self._http(path)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - operator's URL
                return json.load(response), ""
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return _NOT_FOUND, ""
            log.debug("delayq: management API %s answered %s", self.base_url, exc.code)
            if exc.code == 401:  # RabbitMQ's answer to a wrong password and to a user without a management tag
                return None, (f"it answered 401 for the user {self.userid!r}: a wrong password, or a user "
                              "without the 'monitoring' tag")
            return None, f"it answered HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            log.debug("delayq: management API %s not usable: %r", self.base_url, exc)
            return None, f"no answer from {self.base_url}"

    def _vhost_path(self, kind: str, name: str, suffix: str = "") -> str:
        q = urllib.parse.quote
        return f"/api/{kind}/{q(self.vhost, safe='')}/{q(name, safe='')}{suffix}"

    def routes(self, exchange: str, routing_key: str) -> bool | None:
        """Does ``exchange`` have a binding that routes ``routing_key``? ``None``: cannot tell."""
        info = self._get(self._vhost_path("exchanges", exchange))
        if info is None or info is _NOT_FOUND:
            return None if info is None else False
        bindings = self._get(self._vhost_path("exchanges", exchange, "/bindings/source"))
        if not isinstance(bindings, list):
            return None
        if info.get("arguments", {}).get("alternate-exchange"):
            return True  # the alternate exchange takes what no binding does
        exchange_type = str(info.get("type", ""))
        unknown = False
        for binding in bindings:
            matched = key_matches(exchange_type, str(binding.get("routing_key", "")), routing_key)
            if matched:
                return True
            unknown = unknown or matched is None
        return None if unknown else False

    def put_policy(self, name: str, body: dict[str, Any]) -> bool:
        """Create or replace policy ``name`` in the vhost; whether the broker took it."""
        return self._send("PUT", self._vhost_path("policies", name), body)

    def delete_policy(self, name: str) -> bool:
        """Delete policy ``name`` from the vhost; whether it is gone."""
        return self._send("DELETE", self._vhost_path("policies", name), None)

    def _send(self, method: str, path: str, body: dict[str, Any] | None) -> bool:
        if not self.same_broker:
            return False
        request = self._http(path, json.dumps(body).encode() if body is not None else None, method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout):  # noqa: S310 - operator's URL
                return True
        except urllib.error.HTTPError as exc:
            log.info("delayq: management API %s %s answered %s: %s", method, path, exc.code,
                     exc.read()[:200].decode(errors="replace"))
            return exc.code == 404 and method == "DELETE"
        except OSError as exc:
            log.info("delayq: management API %s not usable: %r", self.base_url, exc)
            return False

    def running_nodes(self) -> list[str] | None:
        """Names of the cluster's running nodes (``GET /api/nodes``)."""
        found = self._rows("/api/nodes?columns=name,running")
        return None if found is None else sorted(str(n["name"]) for n in found if n.get("running") and n.get("name"))

    def amqp_listeners(self) -> list[dict[str, Any]] | None:
        """Every node's listeners (``node``, ``protocol``, ``ip_address``, ``port``; ``GET /api/overview``)."""
        found = self._get("/api/overview?columns=listeners")
        if not isinstance(found, dict) or not isinstance(found.get("listeners"), list):
            return None
        return [item for item in found["listeners"] if isinstance(item, dict)]

    def queues(self, names: list[str] | None = None) -> list[dict[str, Any]] | None:
        """Queue statistics of the vhost (``messages``, ``messages_ready``, ``leader``/``node`` ...)."""
        found = self._rows(f"/api/queues/{urllib.parse.quote(self.vhost, safe='')}?columns=name,type,messages,"
                           "messages_ready,messages_unacknowledged,leader,node,members,arguments")
        if found is None or names is None:
            return found
        wanted = set(names)
        return [item for item in found if item.get("name") in wanted]

    def exchanges(self) -> list[dict[str, Any]] | None:
        """The vhost's exchanges (``name``, ``type``); ``None`` when the API cannot tell."""
        return self._rows(f"/api/exchanges/{urllib.parse.quote(self.vhost, safe='')}?columns=name,type")

    def node_handles(self) -> list[dict[str, Any]] | None:
        """Every running node's ``name``, ``fd_total`` and ``sockets_used`` (``GET /api/nodes``).

        ``None`` also when the user may not see every virtual host (not ``monitoring``/``administrator``).
        """
        who = self._get("/api/whoami")
        tags = who.get("tags") if isinstance(who, dict) else None
        tags = tags if isinstance(tags, list) else str(tags or "").split(",")
        if not {"administrator", "monitoring"} & {str(t).strip() for t in tags}:
            return None
        found = self._rows("/api/nodes?columns=name,running,fd_total,sockets_used")
        return None if found is None else [n for n in found if n.get("running", True) and n.get("name")]

    def queue_total(self) -> int | None:
        """How many queues the broker has, in every virtual host (``GET /api/overview``'s ``object_totals``)."""
        found = self._get("/api/overview?columns=object_totals")
        totals = found.get("object_totals") if isinstance(found, dict) else None
        count = totals.get("queues") if isinstance(totals, dict) else None
        return count if isinstance(count, int) else None

    def all_queues(self) -> list[dict[str, Any]] | None:
        """Every virtual host's queues: ``name``, ``vhost``, ``type``, ``leader``/``node``, ``members``."""
        return self._rows("/api/queues?columns=name,vhost,type,leader,node,members")


@dataclass(frozen=True)
class Identity:
    """Whether a management API speaks for the AMQP connection's broker.

    Attributes:
        state: ``ok``, ``unreachable`` or ``other_broker``.
        how: For ``ok``, the sign (``cluster_name``, ``node`` or ``connection``); else what was found.
        api_cluster: The API's ``cluster_name`` ("" when it did not answer).
    """

    state: str
    how: str
    api_cluster: str = ""


def amqp_identity(raw: amqp.Connection) -> tuple[str | None, str | None]:
    """``raw``'s ``cluster_name`` server property and broker-side name (``"client_ip:port -> server_ip:port"``).

    The name is ``None`` when the socket cannot tell (closed).
    """
    cluster = raw.server_properties.get("cluster_name")
    if isinstance(cluster, bytes):
        cluster = cluster.decode()
    name = None
    sock = getattr(getattr(raw, "transport", None), "sock", None) or getattr(raw, "sock", None)
    try:
        if sock is not None:
            (lhost, lport, *_), (rhost, rport, *_) = sock.getsockname(), sock.getpeername()
            name = f"{lhost}:{lport} -> {rhost}:{rport}"
    except (OSError, ValueError):
        name = None
    return (str(cluster) if cluster else None), name


def default_name_of(cluster_name: str, nodes: list[str], *, api_node: str = "", api_cluster: str = "") -> bool:
    """Is ``cluster_name`` the default name RabbitMQ 3.x gives node one of ``nodes``? (pure)

    An unnamed 3.x node ``<name>@<host>`` reports ``<name>@<FQDN>``: the same name before ``@``, and
    hosts equal, one the other's first label, or the pair ``api_node``/``api_cluster`` shows.
    """
    name, at, host = cluster_name.partition("@")
    api_name, api_at, api_host = api_node.partition("@")
    cluster_node, cluster_at, cluster_host = api_cluster.partition("@")
    same_machine = (api_host, cluster_host) if api_at and cluster_at and api_name == cluster_node else None
    return bool(at) and any(
        node_at and node_name == name and (host == node_host or host.startswith(node_host + ".")
                                           or node_host.startswith(host + ".") or same_machine == (node_host, host))
        for node_name, node_at, node_host in (node.partition("@") for node in nodes))


_reported: set[tuple[str, str | None]] = set()


def report_unused(api: ManagementAPI, found: Identity) -> None:
    """Say once per process (per API and broker) that the API is not used, why, and what fixes it.

    WARNING for another broker's or a configured API; INFO for a guessed URL that does not answer.
    """
    key = (api.base_url, api.cluster_name)
    if key in _reported:
        return
    _reported.add(key)
    lost = ("leader placement, held-message detection and recovery after a broker restart, and the "
            "unroutable-key check at publish are off")
    if found.state == "other_broker":
        log.warning("delayq: not using the management API at %s: it answers for %s. Without it %s. Set "
                    "delayq_management_url to the management API of a node of the broker in broker_url "
                    "(or give the cluster one name: `rabbitmqctl set_cluster_name NAME`).",
                    api.base_url, found.how, lost)
    elif api.configured:
        log.warning("delayq: not using the management API at %s: %s. Without it %s. Check "
                    "delayq_management_url and that the rabbitmq_management plugin is on.", api.base_url,
                    found.how, lost)
    else:
        log.info("delayq: no management API at %s (guessed from the broker's host; set delayq_management_url "
                 "if it is elsewhere, or '' to switch it off): %s.", api.base_url, lost)


_NOT_FOUND: Any = object()
