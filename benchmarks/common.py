"""Shared helpers of the delay benchmarks: broker access, vhost lifecycle, statistics.

Everything that talks to RabbitMQ's management side goes through
``rabbitmqctl`` (cheap here: ~0.4 s a call), and everything on the data path
through py-amqp, so the helpers themselves add no Celery or celery_delayq
code to what is being measured.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import quote

import amqp

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
#: Scratch space (worker record files, child logs); ignored by git.
TMP_DIR = RESULTS_DIR / "tmp"

BROKER_HOST = os.environ.get("DELAYQ_BENCH_BROKER_HOST", "127.0.0.1:5672")
BROKER_USER = os.environ.get("DELAYQ_BENCH_BROKER_USER", "guest")
BROKER_PASSWORD = os.environ.get("DELAYQ_BENCH_BROKER_PASSWORD", "guest")


# -- broker management ------------------------------------------------------------
def stop_process(proc: subprocess.Popen[Any], timeout: float = 60.0) -> None:
    """SIGTERM (a warm shutdown), then SIGKILL if it is still running after ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def rabbitmqctl(*args: str, timeout: float = 120.0) -> str:
    """Run ``rabbitmqctl -q ARGS`` and return its stdout (raises on failure)."""
    out = subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True,
                         text=True, timeout=timeout)
    return out.stdout


def process_cpu_ticks(pid: int) -> int:
    """Clock ticks (user + system) process ``pid`` has used, from ``/proc`` (``OSError``: no such process here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def broker_pid() -> int | None:
    """The benchmark broker's OS process id (``rabbitmqctl eval``); ``None`` when it cannot be asked."""
    try:
        return int(rabbitmqctl("eval", "list_to_integer(os:getpid()).", timeout=60).strip())
    except (ValueError, subprocess.SubprocessError, OSError):
        return None


def cpu_s_of(pid: int | None) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used; ``None`` when it is not on this machine."""
    try:
        return None if pid is None else process_cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def script_argv(script: str) -> str:
    """How this run was started (``python SCRIPT ARGS``, and the broker when not the default one), for a table."""
    return " ".join([f"python {script}", *sys.argv[1:]]) + (
        "" if BROKER_HOST == "127.0.0.1:5672" else f" (DELAYQ_BENCH_BROKER_HOST={BROKER_HOST})")


def write_line_results(out: Path, name: str, doc: dict[str, Any], text: str) -> None:
    """``NAME.json`` and ``NAME.md`` under ``out`` (``NAME_rmq4.*`` for a broker of a 4.x line), and the table."""
    stem = name + ("" if str(doc["broker"]).startswith("3.") else "_rmq4")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"{stem}.md").write_text(text)
    print(text)


def broker_url(vhost: str) -> str:
    """AMQP URL of ``vhost`` on the benchmark broker."""
    return f"amqp://{BROKER_USER}:{BROKER_PASSWORD}@{BROKER_HOST}/{quote(vhost, safe='')}"


def connect(vhost: str, timeout: float = 10.0) -> amqp.Connection:
    """A connected raw py-amqp connection to ``vhost`` (heartbeats off)."""
    conn = amqp.Connection(BROKER_HOST, userid=BROKER_USER, password=BROKER_PASSWORD,
                           virtual_host=vhost, connect_timeout=timeout, heartbeat=0)
    conn.connect()
    return conn


def broker_alive(timeout: float = 5.0) -> bool:
    """Does the broker accept a connection? (It stops doing so past its fd limit.)"""
    try:
        conn = connect("/", timeout=timeout)
        conn.close()
        return True
    except Exception:
        return False


def broker_memory_bytes() -> int | None:
    """Total memory of the broker's Erlang VM (``erlang:memory(total)``), in bytes."""
    try:
        return int(rabbitmqctl("eval", "erlang:memory(total).", timeout=60).strip().rstrip("."))
    except Exception:
        return None


def broker_version() -> str:
    """RabbitMQ version string as the server announces it."""
    try:
        conn = connect("/")
        raw = conn.server_properties.get("version", b"?")
        conn.close()
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:
        return "unknown"


@dataclass
class Vhost:
    """A throw-away vhost: everything a benchmark declares dies with it.

    Deleting the vhost is the only cleanup that reliably removes quorum
    queues (and their file handles) even after a crashed child process.
    """

    name: str
    created: bool = False

    @classmethod
    def new(cls, label: str) -> "Vhost":
        """Create ``dqbench-<label>-p<pid>-<random>`` with full permissions for the bench user.

        The creating process's pid in the name lets a later run tell a vhost
        left by a dead run from one of a run that is still going (CI and a
        developer may benchmark on the same broker at once).
        """
        vh = cls(f"{VHOST_PREFIX}{label}-p{os.getpid()}-{uuid.uuid4().hex[:6]}")
        rabbitmqctl("add_vhost", vh.name)
        rabbitmqctl("set_permissions", "-p", vh.name, BROKER_USER, ".*", ".*", ".*")
        vh.created = True
        return vh

    @property
    def url(self) -> str:
        return broker_url(self.name)

    def connect(self) -> amqp.Connection:
        return connect(self.name)

    def delete(self) -> None:
        """Delete the vhost and everything in it (idempotent)."""
        if self.created:
            with contextlib.suppress(Exception):
                rabbitmqctl("delete_vhost", self.name, timeout=300)
            self.created = False


@contextlib.contextmanager
def vhost(label: str) -> Iterator[Vhost]:
    """Context manager around :meth:`Vhost.new` that always deletes it."""
    vh = Vhost.new(label)
    try:
        yield vh
    finally:
        vh.delete()


VHOST_PREFIX = "dqbench-"
_OWNER = re.compile(r"-p(\d+)-[0-9a-f]{6}$")


def list_vhosts() -> list[str]:
    """Names of the broker's vhosts."""
    lines = [line.strip() for line in rabbitmqctl("list_vhosts", "name").splitlines()]
    return [name for name in lines if name and name != "name"]  # rabbitmqctl may print the header


def _owner_alive(vhost_name: str) -> bool:
    m = _OWNER.search(vhost_name)
    if not m:
        return False
    import psutil

    pid = int(m.group(1))
    try:
        return "benchmarks" in " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def delete_stale_vhosts(*, only_own: bool = False) -> list[str]:
    """Delete benchmark vhosts whose run is gone (they pin quorum queues and file handles).

    Vhosts of a benchmark run that is still alive are left alone; with
    ``only_own``, only this process's vhosts are considered.
    """
    gone = []
    with contextlib.suppress(Exception):
        for name in list_vhosts():
            if not name.startswith(VHOST_PREFIX):
                continue
            own = f"-p{os.getpid()}-" in name
            if own != only_own or (not own and _owner_alive(name)):
                continue
            with contextlib.suppress(Exception):
                rabbitmqctl("delete_vhost", name, timeout=300)
                gone.append(name)
    return gone


def queue_depth(conn: amqp.Connection, name: str) -> int | None:
    """Ready messages in ``name`` via a passive declare; ``None`` if it does not exist."""
    ch = conn.channel()
    try:
        return int(ch.queue_declare(name, passive=True).message_count)
    except amqp.NotFound:
        return None
    finally:
        with contextlib.suppress(Exception):
            if ch.is_open:
                ch.close()


def queue_depths(conn: amqp.Connection, names: Iterable[str]) -> dict[str, int]:
    """Depths of many queues over one channel (missing queues are skipped)."""
    out: dict[str, int] = {}
    ch = conn.channel()
    for name in names:
        try:
            out[name] = int(ch.queue_declare(name, passive=True).message_count)
        except amqp.NotFound:
            ch = conn.channel()
    with contextlib.suppress(Exception):
        ch.close()
    return out


def purge(conn: amqp.Connection, names: Iterable[str]) -> None:
    """Purge queues (missing ones are ignored)."""
    ch = conn.channel()
    for name in names:
        try:
            ch.queue_purge(name)
        except amqp.ChannelError:
            ch = conn.channel()
    with contextlib.suppress(Exception):
        ch.close()


# -- statistics -------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated ``q``-th percentile (0..100) of unsorted ``values``."""
    if not values:
        return None
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def lateness_stats(lateness_s: Sequence[float]) -> dict[str, Any]:
    """p50/p99/max lateness in ms and the count of early arrivals (lateness < 0)."""
    ms = [x * 1000.0 for x in lateness_s]
    return {
        "n": len(ms),
        "p50_ms": _r(percentile(ms, 50)),
        "p99_ms": _r(percentile(ms, 99)),
        "max_ms": _r(max(ms) if ms else None),
        "min_ms": _r(min(ms) if ms else None),
        "early": sum(1 for x in ms if x < 0),
    }


def arrival_bursts(times_s: Sequence[float], gap_s: float = 0.001) -> dict[str, Any]:
    """How clumped arrivals are (pure): each time joins the burst of the one before it when it
    follows within ``gap_s``. Returns the p99 (over messages) and max burst size.

    A worker that runs tasks one at a time makes the last of a burst of k wait about k times its
    cost per task, so bursts, not the mean rate, set the worker's share of p99 lateness.
    """
    ordered = sorted(times_s)
    sizes: list[int] = []
    run = 0
    for i, t in enumerate(ordered):
        if i and t - ordered[i - 1] > gap_s:
            sizes.append(run)
            run = 0
        run += 1
    if run:
        sizes.append(run)
    per_message = sorted(size for size in sizes for _ in range(size))
    return {"burst_p99": round(percentile(per_message, 99) or 0) if per_message else None,
            "burst_max": max(sizes) if sizes else None}


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def rate(n: int, seconds: float) -> float:
    """``n / seconds``, 0 for an empty interval."""
    return n / seconds if seconds > 0 else 0.0


# -- processes --------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (psutil)."""
    import psutil

    return psutil.Process(pid).memory_info().rss / (1024 * 1024)


def child_env(**extra: str) -> dict[str, str]:
    """Environment for benchmark subprocesses: the checkout first on ``sys.path``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    return env


class ForeignLoad:
    """CPU used by processes outside this benchmark's process tree (and the broker) during a block.

    The machine is shared (other test suites use the same broker), so every
    measurement records how busy the rest of the machine was meanwhile:
    ``fraction`` is foreign CPU time / (wall time x CPUs).
    """

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.fraction = 0.0
        self._t0 = 0.0
        self._before: dict[int, float] = {}

    @staticmethod
    def _snapshot() -> dict[int, float]:
        import psutil

        ours = {os.getpid()}
        with contextlib.suppress(Exception):
            ours |= {p.pid for p in psutil.Process().children(recursive=True)}
        out: dict[int, float] = {}
        for proc in psutil.process_iter(["pid", "username", "name"]):
            info = proc.info
            if info["pid"] in ours or info.get("username") == "rabbitmq":
                continue
            with contextlib.suppress(Exception):
                t = proc.cpu_times()
                out[info["pid"]] = t.user + t.system
        return out

    def __enter__(self) -> "ForeignLoad":
        self._t0 = time.monotonic()
        self._before = self._snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self._snapshot()
        wall = max(1e-9, time.monotonic() - self._t0)
        self.cpu_s = sum(max(0.0, v - self._before.get(pid, 0.0)) for pid, v in after.items()
                         if pid in self._before)
        self.cpu_s += sum(v for pid, v in after.items() if pid not in self._before) * 0.5  # started meanwhile
        self.fraction = self.cpu_s / (wall * (os.cpu_count() or 1))


# -- machine info -----------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    """CPU, memory, OS and library versions: the context every number depends on."""
    import psutil

    cpu_model = platform.processor() or ""
    with contextlib.suppress(Exception):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {}
    for mod in ("celery", "kombu", "amqp", "celery_delayq"):
        with contextlib.suppress(Exception):
            versions[mod] = __import__(mod).__version__
    fd_limit = None
    with contextlib.suppress(Exception):
        pid = rabbitmqctl("eval", "list_to_integer(os:getpid()).").strip()
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                fd_limit = int(line.split()[3])
    git: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        git["commit"] = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "celery_delayq"],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        git["core_uncommitted"] = [line[3:] for line in dirty if line.strip()]
    other_vhosts: list[str] = []
    with contextlib.suppress(Exception):
        other_vhosts = [v for v in list_vhosts() if v != "/" and f"-p{os.getpid()}-" not in v]
    return {
        "hostname": socket.gethostname(),
        "git": git,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "other_vhosts_on_broker": other_vhosts,
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "rabbitmq": broker_version(),
        "broker_fd_soft_limit": fd_limit,
        **versions,
    }


# -- time budget --------------------------------------------------------------------
@dataclass
class Budget:
    """Wall-clock budget of a run; optional parts are skipped (and say so) when it runs out."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()


def dump_json(path: Path, data: Any) -> None:
    """Write pretty JSON (creating directories)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return _SAFE.sub("_", text)
