"""The chaos soak (issue #36): random faults under steady load on a private 3-node cluster, every task accounted for.

    python -m benchmarks.faults.soak --flavour rmq4 --minutes 5            # a seed is drawn and printed
    python -m benchmarks.faults.soak --flavour host --minutes 30 --seed 17 # replays seed 17's schedule

What runs, per broker line (``host`` = 3.10 with ``dead_letter_worker_publisher_confirm_timeout`` 5000,
the setting of docs/clusters.md; ``rmq4`` = 4.3), both with ``pause_minority``:

- a private 3-node cluster, the management API on node 2 (the app's ``delayq_management_url``), the
  ladder's leaders spread, ``broker_url`` listing the three nodes, quorum task queues, a small ladder
  (7 levels = 164 s per pass for the short run, 8 = 655 s for the long one) so that laps happen;
- two delayq workers (``celery worker`` subprocesses, solo pool, ``task_acks_late``);
- two publishers and two operators in their own processes (:mod:`.soak_procs`): the mix of
  :data:`.soak_procs.MIX` at ``--rate`` tasks/s, countdowns 0.5 s to ``--top`` (120 s short, 600 s
  long), singles and ``batch()`` blocks; the operators cancel the ``cancel`` tasks and run the
  ``runnow`` tasks now (the CLI's ``delayq run-now``) while they wait;
- the faults of :func:`.soak_schedule.draw_schedule` (seeded): broker faults one at a time, client
  faults overlapping them;
- after the load: the cluster healed, ``pending`` and the page read and compared with the ledger, a
  settle until every expected run came (or ``--settle`` seconds after the last due time), the parking
  queue read, ``delayq topology delete`` and a look for any queue left;
- the ledger's checks (:mod:`.soak_ledger`), printed and written to ``--out`` (markdown + json).

Needs root; 4.3 needs the chroot of ../shared/rmq4/start.sh. Never touches the shared brokers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from ..common import stop_process
from .nodes import Cluster, Node
from .scenario import _version, _wait_rejoined
from .soak_ledger import check, read_dir
from .soak_procs import ladder_span, write_app
from .soak_schedule import FaultPlan, draw_schedule

__all__ = ["SoakSettings", "run_soak"]

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
#: RabbitMQ 3.10's remedy for held dead-letter messages after a node loss (docs/clusters.md).
DLX_TIMEOUT_310 = "{dead_letter_worker_publisher_confirm_timeout, 5000}"
PAUSE_MINORITY = "{cluster_partition_handling, pause_minority}"
DEFAULT_PORTS = {"host": 5690, "rmq4": 5693}
#: Seconds a broker CLI call or a node's start may take here (a loaded, shared 2-core machine).
CTL_TIMEOUT = 300.0


@dataclass
class SoakSettings:
    """One soak run's shape."""

    flavour: str
    minutes: float
    seed: int
    base_port: int
    rate: float = 10.0
    top: float = 0.0  # 0: 120 s when minutes <= 10, else 600 s
    levels: int = 0  # 0: 7 when minutes <= 10, else 8
    tail: float = 0.0  # 0: = top for short runs, 240 s for long ones
    settle: float = 300.0
    publishers: int = 2
    workers: int = 2

    def __post_init__(self) -> None:
        short = self.minutes <= 10
        self.top = self.top or (120.0 if short else 600.0)
        self.levels = self.levels or (7 if short else 8)
        self.tail = self.tail or (self.top if short else 240.0)


def _api(node: Node, path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(node.mgmt_url + path, method=method)
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    if method == "DELETE":
        req.add_header("X-Reason", "chaos soak: connection cut")
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - a private node
        body = resp.read()
        return json.loads(body) if body else None


def _api_any(cluster: Cluster, path: str, method: str = "GET") -> Any:
    last: Exception | None = None
    for node in cluster.nodes:
        try:
            return _api(node, path, method)
        except Exception as exc:  # noqa: BLE001 - that node is down or paused: the next one
            last = exc
    raise RuntimeError(f"no management API answered {path}: {last!r}")


class Soak:
    """One run: the processes, the fault threads, and what each fault did."""

    def __init__(self, cfg: SoakSettings, cluster: Cluster, workdir: Path, say: Callable[[str], None]) -> None:
        self.cfg, self.cluster, self.workdir, self.say = cfg, cluster, workdir, say
        self.ledger = workdir / "ledger"
        self.ledger.mkdir(exist_ok=True)
        self.prefix = f"soak{uuid.uuid4().hex[:6]}"
        self.env = dict(os.environ, PYTHONPATH=f"{workdir}:{REPO}")
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.publishers: dict[int, subprocess.Popen[bytes]] = {}
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.t0 = 0.0
        self.end = 0.0
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.topology_left: list[str] = []
        self.celery_own: list[str] = []
        self.incidents: list[dict[str, Any]] = []
        self.pending_raw: dict[str, Any] = {}
        self.parked: list[dict[str, Any]] = []
        self.faulting: set[int] = set()
        self.operator_pids: set[int] = set()

    # -- processes -----------------------------------------------------------
    def start_worker(self, i: int) -> None:
        log = open(self.workdir / f"w{i + 1}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.workers[i] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "soakapp", "worker", "-Q", f"{self.prefix}-dest",
             "-n", f"w{i + 1}@soak", "--pool", "solo", "-l", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat"], env={**self.env, "SOAK_WORKER": f"w{i + 1}"}, cwd=self.workdir,
            stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def wait_worker_ready(self, i: int, timeout: float = 90.0) -> None:
        path = self.workdir / f"w{i + 1}.log"
        start = 0  # called at the first start only
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(path, "rb") as f:
                f.seek(start)
                if b"ready." in f.read():
                    return
            time.sleep(0.5)
        raise RuntimeError(f"worker w{i + 1} did not start: {path.read_text(errors='replace')[-3000:]}")

    def start_publisher(self, i: int) -> None:
        c = self.cfg
        log = open(self.workdir / f"pub{i + 1}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.publishers[i] = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.faults.soak_procs", "publisher", str(i), str(self.ledger),
             str(self.end), str(c.rate / c.publishers), str(c.top), str(ladder_span(c.levels)), str(c.tail),
             str(c.seed)], env=self.env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def start_operator(self, only: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"operator-{only}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.faults.soak_procs", "operator", str(self.ledger),
                                 str(self.end), str(self.workdir), only], env=self.env, cwd=self.workdir, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        return proc

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "celery", "-A", "soakapp", "delayq", *args], env=self.env,
                              cwd=self.workdir, capture_output=True, text=True, timeout=timeout)

    def py(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code], env=self.env, cwd=self.workdir, capture_output=True,
                              text=True, timeout=timeout)

    # -- faults --------------------------------------------------------------
    def note(self, plan: FaultPlan, start: float, **what: Any) -> None:
        with self.lock:
            self.events.append({"n": len(self.events) + 1, **plan.row(), "broker": plan.broker, "start": start, "end": time.time(),
                                "start_s": round(start - self.t0, 1), "took_s": round(time.time() - start, 1),
                                **what})
        self.say(f"  [{time.time() - self.t0:6.1f}s] done: {plan.describe()} "
                 + " ".join(f"{k}={v}" for k, v in what.items()))

    def run_faults(self, plans: list[FaultPlan]) -> None:
        healed = 0.0
        for plan in plans:
            at = max(self.t0 + plan.at_s, healed + 15.0 if plan.broker else 0.0)
            while time.time() < at and not self.stop.is_set():
                time.sleep(0.2)
            if self.stop.is_set() or time.time() > self.end:
                self.say(f"  skipped (after the load): {plan.describe()}")
                continue
            try:
                (self.broker_fault if plan.broker else self.client_fault)(plan)
            except Exception as exc:  # noqa: BLE001 - the fault tooling failed: reported, the run goes on
                self.errors.append(f"{plan.describe()}: {exc!r}")
                self.say(f"  FAULT FAILED {plan.describe()}: {exc!r}")
            if plan.broker:
                healed = time.time()

    def broker_fault(self, plan: FaultPlan) -> None:
        """One broker fault, healed before it returns, whatever failed on the way (then :meth:`heal`).

        The CLI's timeouts are minutes, not the fault suite's 60 s: on this shared machine a
        ``rabbitmqctl`` call took over 60 s at load 25-30, and a partition left half made
        (one side's cookie wrong, the heal never run) is a second fault the schedule did not draw.
        """
        node = self.cluster.nodes[plan.target]
        others = [n for n in self.cluster.nodes if n is not node]
        self.say(f"  [{time.time() - self.t0:6.1f}s] {plan.describe()}")
        start = time.time()
        failed = ""
        try:
            if plan.kind == "kill9":
                node.kill9()
                time.sleep(plan.down_s)
                node.boot(timeout=CTL_TIMEOUT)
            elif plan.kind == "stop_app":
                node.ctl("stop_app", timeout=CTL_TIMEOUT)
                time.sleep(plan.down_s)
                node.ctl("start_app", timeout=CTL_TIMEOUT)
                node.wait_up(CTL_TIMEOUT)
            else:
                for o in others:  # as Node.cut_off, with this run's timeouts
                    node.ctl("eval", f"erlang:set_cookie('{o.nodename}', delayq_partition), "
                                     f"erlang:disconnect_node('{o.nodename}').", timeout=CTL_TIMEOUT)
                for o in others:
                    o.ctl("eval", f"erlang:disconnect_node('{node.nodename}').", timeout=CTL_TIMEOUT)
                time.sleep(plan.down_s)
                self.reconnect(node)
                _wait_rejoined(self.cluster, timeout=CTL_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - healed below, and reported with the fault
            failed = repr(exc)[:300]
            self.say(f"  [{time.time() - self.t0:6.1f}s] {plan.describe()} went wrong ({failed[:200]}); healing")
            self.heal()
        self.note(plan, start, node=node.nodename, outage_s=round(time.time() - start, 1),
                  **({"tooling_failed": failed} if failed else {}))

    def reconnect(self, node: Node) -> None:
        """Undo a cut: the real cookie again on ``node`` for every other node, then connect."""
        for o in self.cluster.nodes:
            if o is not node:
                node.ctl("eval", f"erlang:set_cookie('{o.nodename}', erlang:get_cookie()).", timeout=CTL_TIMEOUT,
                         check=False)
                node.ctl("eval", f"net_kernel:connect_node('{o.nodename}').", timeout=CTL_TIMEOUT, check=False)

    def heal(self) -> None:
        """Every node running, with the real cookies, in one cluster (after a fault whose tooling failed)."""
        for node in self.cluster.nodes:
            if not node.beam_pids():
                with contextlib.suppress(Exception):
                    node.boot(timeout=CTL_TIMEOUT)
        for node in self.cluster.nodes:
            self.reconnect(node)
            node.ctl("start_app", timeout=CTL_TIMEOUT, check=False)
        try:
            _wait_rejoined(self.cluster, timeout=2 * CTL_TIMEOUT)
        except RuntimeError as exc:
            self.errors.append(f"the cluster did not heal: {exc}")

    def supervise(self) -> None:
        """Restart a worker that exited by itself, as systemd's ``Restart=always`` would, and record why it exited."""
        for i, proc in list(self.workers.items()):
            if i in self.faulting or proc.poll() is None:
                continue
            log = (self.workdir / f"w{i + 1}.log").read_text(errors="replace")
            why = [line.split("] ", 1)[-1] for line in log.splitlines() if "CRITICAL" in line or "Unrecoverable" in line]
            with self.lock:
                self.incidents.append({"t_s": round(time.time() - self.t0, 1), "worker": f"w{i + 1}",
                                       "exit": proc.returncode, "why": why[-1][:400] if why else "?"})
            self.say(f"  [{time.time() - self.t0:6.1f}s] worker w{i + 1} exited by itself ({proc.returncode}): "
                     f"{why[-1][:200] if why else '?'}; restarted")
            self.start_worker(i)

    def client_fault(self, plan: FaultPlan) -> None:
        self.say(f"  [{time.time() - self.t0:6.1f}s] {plan.describe()}")
        if plan.kind in ("worker_kill9", "worker_restart"):
            self.faulting.add(plan.target)
            proc = self.workers[plan.target]
            start = time.time()
            if plan.kind == "worker_kill9":
                proc.kill()
                proc.wait()
            else:
                stop_process(proc, 60)
            time.sleep(plan.down_s)
            self.start_worker(plan.target)
            self.faulting.discard(plan.target)
            self.note(plan, start, worker=f"w{plan.target + 1}", pid=proc.pid, exit=proc.returncode)
        elif plan.kind == "publisher_kill9":
            state = self.ledger / f"pub-{plan.target}.state"
            deadline = time.time() + 20
            while time.time() < deadline and (not state.exists() or state.read_text() != "batch"):
                time.sleep(0.05)
            mid = state.exists() and state.read_text() == "batch"
            proc = self.publishers[plan.target]
            start = time.time()
            proc.kill()
            proc.wait()
            time.sleep(plan.down_s)
            if time.time() < self.end - 5:
                self.start_publisher(plan.target)
            self.note(plan, start, publisher=plan.target + 1, pid=proc.pid, mid_batch=mid)
        else:
            start = time.time()
            conns = sorted(_api_any(self.cluster, "/api/connections?columns=name,node,peer_port,client_properties"),
                           key=lambda c: str(c["name"]))
            if not conns:
                self.note(plan, start, cut="no connection listed")
                return
            conn = conns[plan.target % len(conns)]
            pid, role = self.owner_of(int(conn.get("peer_port") or 0))
            _api_any(self.cluster, "/api/connections/" + urllib.parse.quote(str(conn["name"]), safe=""), "DELETE")
            self.note(plan, start, cut=str(conn["name"]), node=conn.get("node"), pid=pid, role=role,
                      worker=role if role.startswith("w") else None)

    def owner_of(self, port: int) -> tuple[int, str]:
        """The soak process holding the client end of a connection (its pid and role)."""
        import psutil

        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.pid:
                for i, p in self.workers.items():
                    if p.pid == c.pid:
                        return c.pid, f"w{i + 1}"
                for i, p in self.publishers.items():
                    if p.pid == c.pid:
                        return c.pid, f"publisher {i + 1}"
                return c.pid, "operator" if c.pid in self.operator_pids else "other"
        return 0, "unknown"

    # -- the run -------------------------------------------------------------
    def run(self, plans: list[FaultPlan]) -> dict[str, Any]:
        c, cl = self.cfg, self.cluster
        write_app(self.workdir, urls=[n.url for n in cl.nodes], mgmt_url=cl.nodes[1].mgmt_url, prefix=self.prefix,
                  ledger=self.ledger, levels=c.levels)
        for i in range(c.workers):
            self.start_worker(i)
        for i in range(c.workers):
            self.wait_worker_ready(i)
        self.t0 = time.time()
        self.end = self.t0 + c.minutes * 60.0
        for i in range(c.publishers):
            self.start_publisher(i)
        operators = [self.start_operator("cancel"), self.start_operator("runnow")]
        self.operator_pids = {p.pid for p in operators}
        faults = threading.Thread(target=self.run_faults, args=([p for p in plans if p.broker],), daemon=True)
        clients = threading.Thread(target=self.run_faults, args=([p for p in plans if not p.broker],), daemon=True)
        faults.start()
        clients.start()
        next_say = time.time() + 30
        while time.time() < self.end:
            time.sleep(min(2.0, max(0.1, self.end - time.time())))
            self.supervise()
            if time.time() >= next_say:
                next_say += 30
                runs = sum(1 for p in self.ledger.glob("run-*.jsonl") for _ in open(p))
                self.say(f"  [{time.time() - self.t0:6.1f}s] runs recorded {runs}; load {os.getloadavg()[0]:.2f}")
        self.stop.set()
        faults.join()
        clients.join()
        for p in [*self.publishers.values(), *operators]:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
        self.say(f"  [{time.time() - self.t0:6.1f}s] load over; healing")
        try:
            _wait_rejoined(cl, timeout=CTL_TIMEOUT)
        except RuntimeError:
            self.heal()
        self.supervise()
        pending_read = self.read_pending()
        last_due = max((json.loads(line).get("due", 0) for p in self.ledger.glob("pub-*.jsonl") for line in open(p)
                        if '"sent"' in line), default=time.time())
        self.say(f"  pending read: {len(pending_read['pending']) if pending_read else 'FAILED'}; settling until every "
                 f"expected run came (last due in {last_due - time.time():.0f} s)")
        deadline = last_due + c.settle
        while time.time() < deadline:
            verdict = check(read_dir(self.ledger), parked=[], faults=self.events, span=ladder_span(c.levels),
                            pending_read=None, leftover=[])
            if verdict["n_lost"] == 0 and time.time() > last_due + 10:
                break
            for _ in range(5):
                time.sleep(2.0)
                self.supervise()
        time.sleep(10.0)  # late duplicates
        parked = self.read_parked()
        self.parked = parked
        for p in self.workers.values():
            p.terminate()
        for p in self.workers.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        leftover = self.delete_everything()
        verdict = check(read_dir(self.ledger), parked=parked, faults=self.events, span=ladder_span(c.levels),
                        pending_read=pending_read, leftover=leftover)
        return verdict

    def read_pending(self) -> dict[str, Any] | None:
        code = ("import json, time\nimport soakapp, celery_delayq\n"
                "from celery_delayq.pending.browse import WaitingFilter, page_of\n"
                "celery_delayq.install(soakapp.app)\n"
                "now = time.time()\n"
                "ts = celery_delayq.pending(soakapp.app, now=now)\n"
                "page = page_of(soakapp.app, WaitingFilter(), limit=10**6, now=now)\n"
                "print(json.dumps({'at': now, 'pending': {t.task_id: t.due for t in ts},"
                " 'page': [t.task_id for t in page.items]}))\n")
        for _ in range(5):
            done = self.py(code)
            if done.returncode == 0:
                self.pending_raw = dict(json.loads(done.stdout.strip().splitlines()[-1]))
                return self.pending_raw
            self.errors.append(f"pending read failed: {done.stderr[-500:]}")
            time.sleep(10)
        return None

    def read_parked(self) -> list[dict[str, Any]]:
        code = ("import json\nimport soakapp\nfrom celery_delayq import ParkingQueue\n"
                "with ParkingQueue.for_app(soakapp.app) as q:\n"
                "    print(json.dumps([{'task_id': m.task_id, 'reason': m.reason, 'parked_at': m.parked_at}"
                " for m in q.list()]))\n")
        done = self.py(code)
        if done.returncode != 0:
            self.errors.append(f"parking read failed: {done.stderr[-500:]}")
            return []
        return list(json.loads(done.stdout.strip().splitlines()[-1]))

    def delete_everything(self) -> list[str]:
        """``delayq topology delete``, then the task queue; what queues remain on the cluster."""
        done = self.cli("topology", "delete", "--discard-messages", "--parking", "--yes")
        if done.returncode != 0:
            self.errors.append(f"topology delete failed: {done.stderr[-500:]}")
        remaining = [str(q["name"]) for q in _api_any(self.cluster, "/api/queues/%2F?columns=name")]
        self.topology_left = [q for q in remaining if q.startswith(self.prefix + ".")]
        # Celery's own (5.5) native delayed-delivery queues, declared by its workers for quorum task queues:
        # not the ladder's, and empty here (every countdown goes through the ladder); reported, then removed.
        rows = _api_any(self.cluster, "/api/queues/%2F?columns=name,messages")
        self.celery_own = [f"{q['name']} ({q.get('messages', 0)} messages)" for q in rows
                           if str(q["name"]).startswith("celery_delayed_")]
        names = [str(q["name"]) for q in rows if str(q["name"]).startswith("celery_delayed_")]
        self.py("import soakapp\nwith soakapp.app.connection_for_write() as c:\n"
                f"    for q in {[self.prefix + '-dest', *names]!r}:\n        c.default_channel.queue_delete(q)\n")
        time.sleep(2)
        return [str(q["name"]) for q in _api_any(self.cluster, "/api/queues/%2F?columns=name")]


def run_soak(cfg: SoakSettings, *, workdir: Path, say: Callable[[str], None] = print,
             cluster: Cluster | None = None) -> dict[str, Any]:
    """Start the cluster, run the soak, stop the cluster and remove its data; the result document.

    ``cluster``: run on this one instead (a test session's; it must have ``pause_minority``), and leave it running.
    """
    plans = draw_schedule(cfg.seed, cfg.minutes, workers=cfg.workers, publishers=cfg.publishers)
    say(f"soak {cfg.flavour}: seed {cfg.seed}, {cfg.minutes:g} min, {len(plans)} faults:")
    for p in plans:
        say(f"  {p.describe()}")
    advanced = f"{PAUSE_MINORITY}, {DLX_TIMEOUT_310}" if cfg.flavour == "host" else PAUSE_MINORITY
    started = time.time()
    own = cluster is None
    if cluster is None:
        cluster = Cluster.start(cfg.flavour, size=3, base_port=cfg.base_port, prefix=f"sk{cfg.flavour[0]}",
                                rabbit_advanced=advanced)
    else:
        advanced = cluster.nodes[0].rabbit_advanced
    try:
        say(f"  cluster up in {time.time() - started:.0f} s: {', '.join(n.nodename for n in cluster.nodes)}")
        broker = _version(cluster.nodes[0])
        soak = Soak(cfg, cluster, workdir, say)
        load = [os.getloadavg()]
        verdict = soak.run(plans)
        load.append(os.getloadavg())
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    finally:
        if own:
            cluster.shutdown()
            for node in cluster.nodes:
                shutil.rmtree(node.flavour.host_path(node._dir), ignore_errors=True)
    return {"flavour": cfg.flavour, "broker": broker, "seed": cfg.seed, "minutes": cfg.minutes,
            "settings": {k: v for k, v in vars(cfg).items()}, "ladder_span_s": ladder_span(cfg.levels),
            "rabbit_advanced": advanced, "schedule": [p.row() | {"what": p.describe()} for p in plans],
            "faults": soak.events, "fault_count": len(soak.events), "errors": soak.errors,
            "topology_left_after_delete": soak.topology_left, "celery_own_queues": soak.celery_own,
            "incidents": soak.incidents, "pending_raw": soak.pending_raw, "parked_read": soak.parked, "uptime_end": uptime,
            "wall_s": round(time.time() - started), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            **verdict}


def markdown(doc: dict[str, Any]) -> str:
    """One run's section of benchmarks/results/soak.md (pure)."""
    t = doc["totals"]
    lines = [f"## {doc['broker']} ({doc['flavour']}), {doc['minutes']:g} min, seed {doc['seed']}: "
             f"{'PASS' if doc['ok'] else '**FAIL**'}", "",
             f"{doc['when']}, wall {doc['wall_s']} s, `{doc['uptime_end']}`; advanced.config `{doc['rabbit_advanced']}`;"
             f" ladder {doc['settings']['levels']} levels ({doc['ladder_span_s']:.0f} s per pass), countdowns 0.5 s -"
             f" {doc['settings']['top']:.0f} s at {doc['settings']['rate']:g} tasks/s.", "",
             "| check | result |", "|---|---|"]
    lines += [f"| {k} | {'yes' if v else '**no**'} |" for k, v in doc["checks"].items()]
    lines += ["", f"Totals: sent {t['sent']}, confirmed {t['confirmed']} ({', '.join(f'{k} {v}' for k, v in t['kinds'].items())}),"
              f" PublishError-named {t['publish_failed']}, unconfirmed {t['unconfirmed']} (of which ran anyway "
              f"{t['unconfirmed_ran']}); runs {t['runs']}; cancels {t['cancels_ok']} (not found {t['cancels_notfound']}),"
              f" run-nows {t['runnows_ok']}, operations left open by an error {t['ops_unknown']}, skipped "
              f"{t['ops_skipped']}; parked {t['parked']} (of which retries parked after a publish failed in a fault: "
              f"{t.get('parked_retry_failed', 0)}); runs after a lap {t['laps_seen']}; lost {doc['n_lost']}, "
              f"early {doc['n_early']}, cancelled and run {len(doc['cancelled_run'])}, duplicates {t['duplicates']}"
              f" ({', '.join(f'{k}: {v}' for k, v in doc['duplicates_by_cause'].items()) or 'none'}).", "",
              f"Pending once healthy: {json.dumps(doc['pending'])}; queues left after `topology delete`: "
              f"{doc['leftover'] or 'none'}.", "",
              "Lateness (s, first run of each pass - its due time): "
              + "; ".join(f"{k} {v}" for k, v in doc["lateness"].items()), "",
              "| # | fault | start (s) | took (s) | what it did | tasks due in it | late p50 / max (s) | duplicates |",
              "|---|---|---|---|---|---|---|---|"]
    effects = {e["n"]: e for e in doc["fault_effect"]}
    for f in doc["faults"]:
        e = effects.get(f["n"], {"tasks_due": 0, "late": {}, "duplicates": 0})
        did = {k: v for k, v in f.items() if k in ("node", "outage_s", "worker", "exit", "mid_batch", "cut", "role",
                                                    "publisher", "tooling_failed")}
        lines.append(f"| {f['n']} | {f['kind']} {f['target'] + 1 if f['kind'] != 'conn_cut' else ''} | {f['start_s']} |"
                     f" {f['took_s']} | {', '.join(f'{k}={v}' for k, v in did.items())} | {e['tasks_due']} |"
                     f" {e['late'].get('p50', '-')} / {e['late'].get('max', '-')} | {e['duplicates']} |")
    for inc in doc.get("incidents", []):
        lines += ["", f"Incident: worker {inc['worker']} exited by itself at t={inc['t_s']} s (status {inc['exit']}):"
                      f" `{inc['why']}`; restarted by the soak's supervisor."]
    if doc.get("celery_own_queues"):
        lines += ["", f"Celery's own delayed-delivery queues (not the ladder's), deleted after: "
                      f"{len(doc['celery_own_queues'])}, messages in them: "
                      f"{sum(int(q.split('(')[1].split()[0]) for q in doc['celery_own_queues'])}."]
    if doc["errors"]:
        lines += ["", "Tooling errors: " + "; ".join(doc["errors"])]
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--flavour", type=click.Choice(["host", "rmq4"]), default="rmq4",
              help="host = RabbitMQ 3.10 (with the dead-letter confirm timeout), rmq4 = 4.3.")
@click.option("--minutes", type=float, default=5.0, help="Length of the load (5 = the CI version, 30 = the soak).")
@click.option("--seed", type=int, default=None, help="Replays a schedule; drawn and printed when left out.")
@click.option("--base-port", type=int, default=None, help="AMQP port of node 1 (5690 host, 5693 rmq4).")
@click.option("--rate", type=float, default=10.0, help="Tasks per second over all publishers.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS / "soak",
              help="Writes <out>-<flavour>-<minutes>m-<seed>.json and appends its section to <out>.md.")
@click.option("--keep", type=click.Path(path_type=Path), default=Path("/tmp/soak-ledgers"),
              help="Where the run's directory (ledger files, worker and publisher logs) is copied.")
def main(flavour: str, minutes: float, seed: int | None, base_port: int | None, rate: float, out: Path,
         keep: Path) -> None:
    """Random faults under steady load on a private 3-node cluster; every task accounted for."""
    seed = random.SystemRandom().randrange(1, 10**6) if seed is None else seed
    cfg = SoakSettings(flavour, minutes, seed, base_port or DEFAULT_PORTS[flavour], rate=rate)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        doc = run_soak(cfg, workdir=Path(tmp), say=lambda s: print(s, flush=True))
        kept = keep / f"{flavour}-{minutes:g}m-{seed}"  # the evidence, for finding a cause
        shutil.copytree(Path(tmp), kept, dirs_exist_ok=True)
        doc["kept"] = str(kept)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}-{flavour}-{minutes:g}m-{seed}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    with open(f"{out}.md", "a") as f:
        f.write("\n" + markdown(doc))
    print(markdown(doc))
    sys.exit(0 if doc["ok"] else 1)


if __name__ == "__main__":
    main()
