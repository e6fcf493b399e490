"""Benchmark child process: runs publish, paced-publish and consume jobs on command.

Protocol (JSON lines): the parent sends ``{"op": "job", "job": {...}}``; the
child sets up and answers ``{"ready": true}``; the parent sends
``{"op": "go"}`` (or ``abort``); the child runs and answers
``{"result": {...}}`` or ``{"error": "traceback"}``. A consume job also
accepts ``{"op": "expect", "n": N, "timeout": s}`` while running, which tells
it how many messages to wait for.

Job kinds: ``publish`` (N confirmed delayed publishes as fast as possible),
``paced`` (a steady offered rate for a duration), ``consume`` (a raw py-amqp
consumer recording arrival times), and ``call`` (``handler`` =
``"module:function"``, for scenario-specific jobs such as profiling).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import select
import socket
import sys
import time
import traceback
from typing import Any, Callable
from urllib.parse import unquote, urlparse

import amqp


class Aborted(Exception):
    """The parent called the job off at the barrier."""


class Proto:
    """The child's side of the JSON-lines protocol, on file descriptors 0 and a dup of 1.

    Stray prints from libraries go to stderr (the child's log), never into the protocol.
    """

    def __init__(self) -> None:
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        self.buf = b""

    def send(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def _line(self) -> dict[str, Any] | None:
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return json.loads(line)
        return None

    def read(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Next message, waiting up to ``timeout`` (None = forever); None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            msg = self._line()
            if msg is not None:
                return msg
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([0], [], [], left)
            if not readable:
                return None
            chunk = os.read(0, 65536)
            if not chunk:
                raise SystemExit(0)  # parent went away
            self.buf += chunk

    def ready(self) -> float:
        """Tell the parent set-up is done; block until released. Returns the go time."""
        self.send({"ready": True})
        msg = self.read()
        assert msg is not None
        if msg.get("op") == "abort":
            raise Aborted("aborted at the barrier")
        return float(msg.get("at", time.time()))


# -- helpers ------------------------------------------------------------------------
def raw_connection(url: str) -> amqp.Connection:
    """py-amqp connection for an ``amqp://`` URL (heartbeats off)."""
    u = urlparse(url)
    conn = amqp.Connection(f"{u.hostname}:{u.port or 5672}", userid=unquote(u.username or "guest"),
                           password=unquote(u.password or "guest"), virtual_host=unquote(u.path[1:]) or "/",
                           heartbeat=0)
    conn.connect()
    return conn


def _peer(job: dict[str, Any]) -> Any:
    from benchmarks.peers import make_peer

    peer = make_peer(job["peer"], job["url"], **(job.get("opts") or {}))
    if job.get("declare", True):
        peer.declare()
    return peer


# -- jobs -----------------------------------------------------------------------------
def job_publish(proto: Proto, job: dict[str, Any]) -> dict[str, Any]:
    """Publish ``n`` delayed messages as fast as the mode allows (confirmed per the mode)."""
    peer = _peer(job)
    pub = peer.publisher(job["mode"])
    rng = random.Random(job.get("seed", 0))
    lo, hi = job["delay"]
    with pub.batch():  # warm-up: connections, declarations, exit queues, caches
        for i in range(int(job.get("warmup", 20))):
            pub.send(time.time() + rng.uniform(lo, hi), -1 - i)
    proto.ready()
    n, base, max_s = int(job["n"]), int(job.get("seq_base", 0)), float(job.get("max_seconds", 1e9))
    sent = 0
    t0 = time.time()
    with pub.batch():
        while sent < n:
            pub.send(time.time() + rng.uniform(lo, hi), base + sent)
            sent += 1
            if sent % 100 == 0 and time.time() - t0 > max_s:
                break
    t1 = time.time()
    pub.close()
    peer.close()
    return {"n": sent, "t0": t0, "t1": t1, "rate": sent / (t1 - t0) if t1 > t0 else 0.0, "capped": sent < n}


def job_paced(proto: Proto, job: dict[str, Any]) -> dict[str, Any]:
    """Offer ``rate`` delayed messages/s for ``duration`` s; report what was achieved.

    Every tick publishes what the schedule says is owed by now (at most
    ``chunk`` per confirm batch), so a publisher that cannot keep up shows
    up as a lower achieved rate, not as a silently stretched run.
    """
    peer = _peer(job)
    pub = peer.publisher(job["mode"])
    rng = random.Random(job.get("seed", 0))
    lo, hi = job["delay"]
    rate, duration = float(job["rate"]), float(job["duration"])
    chunk = int(job.get("chunk", 100))
    with pub.batch():
        pub.send(time.time() + lo + 0.5, -1)  # warm-up (the consumer ignores negative seqs)
    proto.ready()
    base = int(job.get("seq_base", 0))
    total = int(rate * duration)
    sent = 0
    behind_max = 0
    t0 = time.time()
    while sent < total:
        el = time.time() - t0
        if el >= duration * 1.5:  # hopelessly behind: stop offering
            break
        owed = min(total, int(rate * el) + 1) - sent
        if owed <= 0:
            time.sleep(min(0.002, max(0.0, (sent + 1) / rate - el)))
            continue
        behind_max = max(behind_max, owed)
        with pub.batch():
            for _ in range(min(owed, chunk)):
                pub.send(time.time() + rng.uniform(lo, hi), base + sent)
                sent += 1
    t1 = time.time()
    pub.close()
    peer.close()
    return {"n": sent, "t0": t0, "t1": t1, "offered": rate, "achieved": sent / max(duration, t1 - t0),
            "max_behind": behind_max}


def job_consume(proto: Proto, job: dict[str, Any]) -> dict[str, Any]:
    """Consume ``queue`` (auto-ack) and record ``[seq, due, arrival, hops_header, dead_letterings]``.

    ``dead_letterings`` is the sum of the ``x-death`` counts: the broker's own
    count of the queues the message was dead-lettered from.
    """
    conn = raw_connection(job["url"])
    ch = conn.channel()
    ch.basic_qos(0, int(job.get("prefetch", 2000)), False)
    records: list[list[Any]] = []
    seen: set[int] = set()
    dupes = 0

    def on_message(m: amqp.Message) -> None:
        nonlocal dupes
        arrival = time.time()
        from benchmarks.peers import decode_body

        due, seq = decode_body(m.body)
        if seq < 0:
            return
        if seq in seen:
            dupes += 1
            return
        seen.add(seq)
        headers = getattr(m, "application_headers", None) or m.properties.get("application_headers") or {}
        deaths = sum(int(d.get("count", 1)) for d in headers.get("x-death") or [])
        records.append([seq, due, arrival, headers.get("x-delayq-hops"), deaths])

    ch.basic_consume(job["queue"], callback=on_message, no_ack=True)
    go = proto.ready()
    deadline = go + float(job.get("max_seconds", 600))
    expected: int | None = job.get("expect")
    next_poll = 0.0
    while True:
        try:
            conn.drain_events(timeout=0.05)
        except socket.timeout:
            pass
        now = time.time()
        if now >= next_poll:
            next_poll = now + 0.05
            msg = proto.read(0)
            if msg is not None and msg.get("op") == "expect":
                expected = int(msg["n"])
                deadline = min(deadline, now + float(msg.get("timeout", 60)))
            elif msg is not None and msg.get("op") == "stop":
                break
        if expected is not None and len(seen) >= expected:
            break
        if now > deadline:
            break
    conn.close()
    out: dict[str, Any] = {"received": len(seen), "duplicates": dupes}
    if job.get("summary"):
        from benchmarks.common import lateness_stats

        out["lateness"] = lateness_stats([r[2] - r[1] for r in records])
        arr = sorted(r[2] for r in records)
        out["first_arrival"], out["last_arrival"] = (arr[0], arr[-1]) if arr else (None, None)
        out["mean_deaths"] = sum(r[4] for r in records) / len(records) if records else None
    else:
        out["records"] = records
    return out


def job_declare(proto: Proto, job: dict[str, Any]) -> dict[str, Any]:
    """Declare a peer's topology (so consumers can attach before publishers start)."""
    peer = _peer(dict(job, declare=True))
    peer.close()
    proto.ready()
    return {"declared": job["peer"]}


def job_call(proto: Proto, job: dict[str, Any]) -> dict[str, Any]:
    """Run ``handler(proto, job)`` from ``"module:function"`` (scenario-specific jobs)."""
    module, func = job["handler"].split(":")
    fn: Callable[[Proto, dict[str, Any]], dict[str, Any]] = getattr(importlib.import_module(module), func)
    return fn(proto, job)


JOBS: dict[str, Callable[[Proto, dict[str, Any]], dict[str, Any]]] = {
    "publish": job_publish, "paced": job_paced, "consume": job_consume, "call": job_call,
    "declare": job_declare,
}


def main() -> None:
    if not os.environ.get("DQB_PURE"):
        # As in an application, celery_delayq is imported before any producer exists:
        # kombu producer pools created earlier keep plain producers, and delayed
        # publishes through them would silently skip the ladder.
        import celery_delayq  # noqa: F401
    proto = Proto()
    while True:
        msg = proto.read()
        if msg is None or msg.get("op") == "exit":
            return
        if msg.get("op") != "job":
            continue  # a late "expect"/"stop" for a job that already ended
        job = msg["job"]
        try:
            result = JOBS[job["kind"]](proto, job)
            proto.send({"result": result})
        except Aborted as exc:
            proto.send({"error": str(exc)})
        except BaseException:  # noqa: BLE001 - report everything to the parent
            proto.send({"error": traceback.format_exc()})
        sys.stderr.flush()


if __name__ == "__main__":
    main()
