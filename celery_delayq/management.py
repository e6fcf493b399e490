"""What AMQP cannot tell, asked of RabbitMQ's management HTTP API (when it is there).

AMQP 0-9-1 cannot list bindings, and it cannot see messages a quorum queue
holds in its dead-letter state. Both matter to the ladder: a destination
exchange without a binding for the routing key would hold a message in its
exit queue for ever (at-least-once dead-lettering retries, it never drops),
and a held message is invisible to a passive declare.

The API is optional (the ``rabbitmq_management`` plugin): every call here
answers ``None`` ("cannot tell") when it is off or unreachable, quickly, and
callers fall back to what AMQP can do. Stdlib only.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["ManagementAPI", "key_matches"]

log = logging.getLogger(__name__)

#: The management plugin's default port.
DEFAULT_PORT = 15672


def key_matches(exchange_type: str, binding_key: str, routing_key: str) -> bool | None:
    """Does a binding with ``binding_key`` route ``routing_key``? ``None``: depends on headers.

    Pure: direct compares, topic matches ``*`` (one word) and ``#`` (zero or
    more), fanout always routes; headers (and plugin types) cannot be told
    from the key.
    """
    if exchange_type == "fanout":
        return True
    if exchange_type == "direct":
        return binding_key == routing_key
    if exchange_type == "topic":
        return _topic_match(binding_key.split("."), routing_key.split("."))
    return None


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

    base_url: str
    vhost: str
    userid: str
    password: str
    timeout: float = 2.0
    #: The AMQP connection's ``cluster_name``: an API of another broker (a URL
    #: guessed from the host name) must never answer for this one.
    cluster_name: str | None = None

    @classmethod
    def for_connection(cls, connection: Any, url: str | None = None, *,
                       cluster_name: str | None = None) -> "ManagementAPI | None":
        """The API of a kombu connection's broker: ``url``, else ``http://<host>:15672``; ``url=""`` = off.

        ``cluster_name`` (from the AMQP connection's server properties) is checked
        against the API's before any answer is trusted.
        """
        if url == "":
            return None
        if url is None:
            url = f"http://{connection.hostname or 'localhost'}:{DEFAULT_PORT}"
        return cls(url.rstrip("/"), connection.virtual_host or "/", connection.userid or "guest",
                   connection.password or "guest", cluster_name=cluster_name)

    @classmethod
    def for_broker(cls, connection: Any, raw: Any, url: str | None = None) -> "ManagementAPI | None":
        """:meth:`for_connection`, checked against the ``cluster_name`` of the broker ``raw`` reached.

        ``raw``: the open ``amqp.Connection`` whose server properties name the cluster.
        """
        cluster = raw.server_properties.get("cluster_name")
        return cls.for_connection(connection, url,
                                  cluster_name=cluster.decode() if isinstance(cluster, bytes) else cluster)

    @property
    def same_broker(self) -> bool:
        """Does this API speak for the broker the AMQP connection reached?

        An answer is kept; no answer (the API down, or slow after a restart) is
        not, so a later call asks again.
        """
        known = self.__dict__.get("_same_broker")
        if known is not None:
            return bool(known)
        overview = self._request("/api/overview")
        if not isinstance(overview, dict):
            return False
        same = not (self.cluster_name and overview.get("cluster_name") != self.cluster_name)
        if not same:
            log.info("delayq: management API at %s belongs to cluster %r, not %r; not using it",
                     self.base_url, overview.get("cluster_name"), self.cluster_name)
        self.__dict__["_same_broker"] = same
        return same

    def _get(self, path: str) -> Any:
        if not self.same_broker:
            return None
        return self._request(path)

    def _request(self, path: str) -> Any:
        request = urllib.request.Request(self.base_url + path)
        token = base64.b64encode(f"{self.userid}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - operator's URL
                return json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return _NOT_FOUND
            log.debug("delayq: management API %s answered %s", self.base_url, exc.code)
            return None
        except (OSError, ValueError) as exc:
            log.debug("delayq: management API %s not usable: %r", self.base_url, exc)
            return None

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
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        token = base64.b64encode(f"{self.userid}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
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
        found = self._get("/api/nodes?columns=name,running")
        if not isinstance(found, list):
            return None
        return sorted(str(n["name"]) for n in found if n.get("running") and n.get("name"))

    def amqp_listeners(self) -> list[dict[str, Any]] | None:
        """Every node's listeners (``node``, ``protocol``, ``ip_address``, ``port``; ``GET /api/overview``)."""
        found = self._get("/api/overview?columns=listeners")
        if not isinstance(found, dict) or not isinstance(found.get("listeners"), list):
            return None
        return [item for item in found["listeners"] if isinstance(item, dict)]

    def queues(self, names: list[str] | None = None) -> list[dict[str, Any]] | None:
        """Queue statistics of the vhost (``messages``, ``messages_ready``, ``leader``/``node`` ...)."""
        q = urllib.parse.quote(self.vhost, safe="")
        found = self._get(f"/api/queues/{q}?columns=name,type,messages,messages_ready,"
                          "messages_unacknowledged,leader,node,members,arguments")
        if not isinstance(found, list):
            return None
        if names is not None:
            wanted = set(names)
            found = [item for item in found if item.get("name") in wanted]
        return found

    def node_handles(self) -> list[dict[str, Any]] | None:
        """Every running node's ``name``, ``fd_total`` and ``sockets_used`` (``GET /api/nodes``).

        ``None`` also when the user may not see every virtual host (neither the
        ``monitoring`` nor the ``administrator`` tag): what its queues reserve
        could then not be counted.
        """
        who = self._get("/api/whoami")
        tags = who.get("tags") if isinstance(who, dict) else None
        tags = tags if isinstance(tags, list) else str(tags or "").split(",")
        if not {"administrator", "monitoring"} & {str(t).strip() for t in tags}:
            return None
        found = self._get("/api/nodes?columns=name,running,fd_total,sockets_used")
        if not isinstance(found, list):
            return None
        return [n for n in found if isinstance(n, dict) and n.get("running", True) and n.get("name")]

    def queue_total(self) -> int | None:
        """How many queues the broker has, in every virtual host (``GET /api/overview``'s ``object_totals``)."""
        found = self._get("/api/overview?columns=object_totals")
        totals = found.get("object_totals") if isinstance(found, dict) else None
        count = totals.get("queues") if isinstance(totals, dict) else None
        return count if isinstance(count, int) else None

    def all_queues(self) -> list[dict[str, Any]] | None:
        """Every virtual host's queues: ``name``, ``vhost``, ``type``, ``leader``/``node``, ``members``."""
        found = self._get("/api/queues?columns=name,vhost,type,leader,node,members")
        return found if isinstance(found, list) else None


_NOT_FOUND: Any = object()
