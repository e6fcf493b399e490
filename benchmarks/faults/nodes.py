"""Private RabbitMQ nodes and clusters on this machine, for tests that kill, stop or restart a broker.

Tests must never restart the shared broker (:5672, and the 4.3 node on :5673):
every other test's connections go through it. A private node has a name, ports,
config, data and log directory of its own (``RABBITMQ_CONFIG_FILE`` included: the
machine's ``rabbitmq.conf`` pins port 5672), so it can be killed freely.

Two flavours, each per ``DESIGN-NOTES.md`` §6:

- ``host``: the machine's RabbitMQ (3.10.8 here), run as the ``rabbitmq`` user,
  sharing the host's epmd and Erlang cookie;
- ``rmq4``: RabbitMQ 4.3 inside the chroot ``../shared/rmq4/start.sh`` builds,
  sharing that chroot's private epmd (4373) and cookie. ``start.sh`` must have
  run once (it builds the chroot and mounts /proc etc.).

Needs root. Usage::

    with Cluster.start("host", size=3, base_port=5690) as cluster:
        url = cluster.nodes[0].url
        cluster.nodes[0].kill9(); cluster.nodes[0].boot()
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

__all__ = ["Flavour", "Node", "Cluster", "FLAVOURS", "NodeError", "unavailable", "usable_flavours"]


class NodeError(RuntimeError):
    """A private node did not start, stop or join as asked (the message holds its log's tail)."""


@dataclass(frozen=True)
class Flavour:
    """Where a RabbitMQ installation lives and how its commands run as the ``rabbitmq`` user."""

    name: str
    #: Prefix of every path the node sees ("" on the host; the chroot's root for rmq4).
    root: str
    epmd_port: int
    #: Directory, as the node sees it, under which private nodes keep their files.
    data_dir: str = "/var/lib/rabbitmq/delayq-nodes"

    def command(self, argv: Sequence[str], env: dict[str, str]) -> list[str]:
        """``argv`` run as the rabbitmq user with exactly ``env`` (plus PATH/HOME/locale)."""
        base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/var/lib/rabbitmq", "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8", "ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
                "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}", **env}
        pairs = [f"{k}={v}" for k, v in base.items()]
        if self.root:
            return ["chroot", "--userspec=rabbitmq:rabbitmq", self.root, "/usr/bin/env", "-i", *pairs, *argv]
        return ["setpriv", "--reuid=rabbitmq", "--regid=rabbitmq", "--init-groups", "/usr/bin/env", "-i",
                *pairs, *argv]

    def host_path(self, path: str) -> Path:
        """Where a path the node sees lies on the host."""
        return Path(self.root + path) if self.root else Path(path)


FLAVOURS = {
    "host": Flavour("host", "", 4369),
    "rmq4": Flavour("rmq4", os.environ.get("RMQ4_ROOT", "/var/lib/rmq4/sid-root"), 4373),
    # 4.0.x: the trixie chroot (`RMQ4_SUITE=trixie RMQ4_ROOT=/var/lib/rmq4/trixie-root ... start.sh`, see
    # ../shared/rmq4/README.md), its own epmd. Only the at-load fault suite asks for it.
    "rmq40": Flavour("rmq40", os.environ.get("RMQ40_ROOT", "/var/lib/rmq4/trixie-root"), 4374),
}

_BIN = "/usr/lib/rabbitmq/bin"


def unavailable(flavour: str) -> str | None:
    """Why private nodes of ``flavour`` cannot run here (``None``: they can)."""
    if os.geteuid() != 0:
        return "private broker nodes need root"
    fl = FLAVOURS[flavour]
    if not fl.host_path(f"{_BIN}/rabbitmq-server").exists():
        return f"no RabbitMQ server at {fl.host_path(_BIN)}" + (
            " (../shared/rmq4/start.sh builds the chroot; RMQ4_SUITE=trixie for 4.0)" if fl.root else "")
    if fl.root and not Path(fl.root, "proc/self").exists():
        return f"{fl.root}/proc is not mounted (../shared/rmq4/start.sh mounts it)"
    return None


def usable_flavours(only: str | None = None, *, say: Callable[[str], None] = print) -> list[str]:
    """The flavours to run (``only`` one, or both), minus those this machine cannot run (``say`` tells why)."""
    out = []
    for flavour in ("host", "rmq4"):
        if only and flavour != only:
            continue
        why = unavailable(flavour)
        if why:
            say(f"skipping {flavour}: {why}")
            continue
        out.append(flavour)
    return out


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Node:
    """One private broker node: ``<name>@localhost`` on 127.0.0.1:``amqp_port``."""

    flavour: Flavour
    name: str
    amqp_port: int
    dist_port: int
    mgmt_port: int = 0
    #: ``advanced.config`` Erlang terms for the ``rabbit`` application (e.g. dead-letter timeouts).
    rabbit_advanced: str = ""
    _ctl_ports: tuple[int, int] = field(default=(0, 0), repr=False)
    #: Open-files limit of the node's VM (``ulimit -n``); ``None`` = what this process has.
    #: Debian's packaging leaves rabbitmq-server at 1024, where RabbitMQ 3.x's quorum queues wedge it.
    nofile: int | None = None

    @property
    def nodename(self) -> str:
        return f"{self.name}@localhost"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}//"

    @property
    def mgmt_url(self) -> str:
        return f"http://127.0.0.1:{self.mgmt_port}" if self.mgmt_port else ""

    @property
    def _dir(self) -> str:
        return f"{self.flavour.data_dir}/{self.name}"

    def env(self) -> dict[str, str]:
        d = self._dir
        lo, hi = self._ctl_ports if self._ctl_ports != (0, 0) else (self.dist_port + 1000, self.dist_port + 1019)
        return {
            "RABBITMQ_NODENAME": self.nodename, "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": f"{d}/rabbitmq.conf", "RABBITMQ_ADVANCED_CONFIG_FILE": f"{d}/advanced.config",
            "RABBITMQ_CONF_ENV_FILE": f"{d}/rabbitmq-env.conf",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{d}/enabled_plugins",
            "RABBITMQ_MNESIA_BASE": f"{d}/mnesia", "RABBITMQ_LOG_BASE": f"{d}/log",
            "RABBITMQ_PID_FILE": f"{d}/pid",
            "RABBITMQ_CTL_DIST_PORT_MIN": str(lo), "RABBITMQ_CTL_DIST_PORT_MAX": str(hi),
        }

    # -- files ---------------------------------------------------------------
    def write_config(self, *, wipe: bool) -> None:
        """The node's own config files (and, with ``wipe``, an empty data directory)."""
        where = self.flavour.host_path(self._dir)
        if wipe and where.exists():
            shutil.rmtree(where)
        (where / "log").mkdir(parents=True, exist_ok=True)
        (where / "mnesia").mkdir(exist_ok=True)
        conf = [f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}", "loopback_users.guest = true",
                "distribution.listener.interface = 127.0.0.1"]
        if self.mgmt_port:
            conf += ["management.tcp.ip = 127.0.0.1", f"management.tcp.port = {self.mgmt_port}"]
        (where / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        (where / "rabbitmq-env.conf").write_text("")
        (where / "advanced.config").write_text(
            f"[{{rabbit, [{self.rabbit_advanced}]}}].\n" if self.rabbit_advanced else "[].\n")
        (where / "enabled_plugins").write_text("[rabbitmq_management].\n" if self.mgmt_port else "[].\n")
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(where)], check=True)
        if self.flavour.root:  # the chroot's rabbitmq user may have another uid
            subprocess.run(["chroot", self.flavour.root, "chown", "-R", "rabbitmq:rabbitmq", self._dir], check=True)

    def log_tail(self, lines: int = 30) -> str:
        logs = sorted(self.flavour.host_path(f"{self._dir}/log").glob("*.log"))
        text = "\n".join(p.read_text(errors="replace") for p in logs[-2:])
        return "\n".join(text.splitlines()[-lines:])

    # -- life ----------------------------------------------------------------
    def boot(self, *, timeout: float = 90.0) -> None:
        """Start the node (its data kept) and wait until it answers AMQP and the CLI."""
        if _port_open(self.amqp_port):
            raise NodeError(f"port {self.amqp_port} is taken: is {self.nodename} already running?")
        argv = self.flavour.command([f"{_BIN}/rabbitmq-server"], self.env())
        if self.nofile is not None:
            argv = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *argv]
        out = self.flavour.host_path(f"{self._dir}/log/console.out")
        with open(out, "ab") as sink:
            subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        self.wait_up(timeout)

    def wait_up(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _port_open(self.amqp_port) and self.ctl("await_startup", timeout=30, check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise NodeError(f"{self.nodename} did not start on 127.0.0.1:{self.amqp_port} in {timeout:.0f} s; "
                        f"log tail:\n{self.log_tail()}")

    def ctl(self, *args: str, tool: str = "rabbitmqctl", timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """A CLI tool (``rabbitmqctl``, ``rabbitmq-queues`` ...) against this node."""
        argv = self.flavour.command([f"{_BIN}/{tool}", "-n", self.nodename, *args], self.env())
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            if check:
                raise NodeError(f"{tool} {' '.join(args)} on {self.nodename} timed out after {timeout} s") from None
            return subprocess.CompletedProcess(argv, 124, "", "timeout")
        if check and done.returncode != 0:
            raise NodeError(f"{tool} {' '.join(args)} on {self.nodename} failed: {done.stderr.strip() or done.stdout}")
        return done

    def beam_pids(self) -> list[int]:
        """PIDs of this node's Erlang VM, found by its node name in /proc/PID/environ."""
        found = []
        marker = f"RABBITMQ_NODENAME={self.nodename}".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "comm").read_text().strip() != "beam.smp":
                    continue
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
        return found

    def kill9(self) -> None:
        """SIGKILL the node's VM (a crash: nothing is flushed) and wait until its port closes."""
        pids = self.beam_pids()
        if not pids:
            raise NodeError(f"{self.nodename}: no beam.smp process to kill")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while _port_open(self.amqp_port) and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.wait_up()

    def cut_off(self, others: Sequence["Node"]) -> None:
        """Partition this node from ``others``: Erlang distribution between them drops and cannot reconnect.

        No iptables here, and every node listens on 127.0.0.1, so the cut is made
        where RabbitMQ's nodes meet: this node is told a wrong cookie for the
        others and the connections are dropped. Every reconnection attempt then
        fails its handshake, exactly as it would behind a dead link, while
        clients and the CLI (which use the real cookie) still reach both sides.
        """
        for o in others:  # one side only: both sides with the same wrong cookie would agree again
            self.ctl("eval", f"erlang:set_cookie('{o.nodename}', delayq_partition), "
                             f"erlang:disconnect_node('{o.nodename}').")
        for o in others:
            o.ctl("eval", f"erlang:disconnect_node('{self.nodename}').")

    def reconnect(self, others: Sequence["Node"]) -> None:
        """Heal :meth:`cut_off`: the real cookie again on both sides, then connect."""
        for o in others:
            self.ctl("eval", f"erlang:set_cookie('{o.nodename}', erlang:get_cookie()).", check=False)
            self.ctl("eval", f"net_kernel:connect_node('{o.nodename}').", check=False)

    def shutdown(self) -> None:
        """Stop the node; a node that does not stop within 30 s is killed."""
        if self.ctl("shutdown", timeout=30, check=False).returncode != 0 and self.beam_pids():
            self.kill9()


@dataclass
class Cluster:
    """``size`` private nodes ``<prefix>1..N@localhost``, clustered with the first."""

    nodes: list[Node]

    @classmethod
    def start(cls, flavour: str = "host", *, size: int = 3, base_port: int = 5690, prefix: str = "dq",
              management: bool = True, rabbit_advanced: str = "", nofile: int | None = None) -> "Cluster":
        """Wipe, start and cluster ``size`` nodes; AMQP on ``base_port + i`` (5670-5699), management on ``15000 + base_port % 1000 * 10 + i``.

        ``nofile``: the nodes' open-files limit (``ulimit -n``), e.g. Debian's default 1024.
        """
        # Two bands: 5670-5699 (the suites' and the fault benchmarks') and 5760-5789 (helpers' private
        # benchmarks, apart from both). Each band has its own distribution and CLI port ranges.
        if 5670 <= base_port <= 5699 - (size - 1):
            dist, cli = 24000 + base_port % 1000 * 10, 31000 + (base_port - 5670) * 50
        elif 5760 <= base_port <= 5789 - (size - 1):
            dist, cli = 26000 + (base_port - 5760) * 10, 28000 + (base_port - 5760) * 50
        else:
            raise ValueError(f"base_port must leave its {size} node(s) within 5670-5699 or 5760-5789 "
                             f"(the port plan), got {base_port}")
        fl = FLAVOURS[flavour]
        # Distribution and CLI ports stay below Linux's ephemeral range (32768-60999): a client socket
        # that happened to get one as its local port made a node fail to boot (dist_port_already_used).
        nodes = [Node(fl, f"{prefix}{i + 1}", base_port + i, dist + i,
                      (15000 + base_port % 1000 * 10 + i) if management else 0, rabbit_advanced,
                      (cli + 20 * i, cli + 20 * i + 19), nofile)
                 for i in range(size)]
        cluster = cls(nodes)
        try:
            for node in nodes:
                node.write_config(wipe=True)
                node.boot()
            for node in nodes[1:]:
                node.stop_app()
                node.ctl("join_cluster", nodes[0].nodename)
                node.start_app()
            nodes[0].ctl("enable_feature_flag", "all", check=False)
        except BaseException:
            cluster.shutdown()
            raise
        return cluster

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def running(self) -> list[str]:
        """Names of the running nodes, as the first node that answers sees them (``cluster_status``)."""
        return self.running_as_seen_by(*self.nodes)

    @staticmethod
    def running_as_seen_by(*nodes: Node) -> list[str]:
        """Running nodes per the first of ``nodes`` that answers (3.10 and 4.x alike)."""
        for node in nodes:
            done = node.ctl("cluster_status", "--formatter", "json", check=False, timeout=20)
            if done.returncode == 0:
                try:
                    return sorted(json.loads(done.stdout).get("running_nodes") or [])
                except ValueError:
                    continue
        return []

    def shutdown(self) -> None:
        for node in reversed(self.nodes):
            if node.beam_pids():
                node.shutdown()
