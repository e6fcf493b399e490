"""Item 3: worker RSS with many delayed tasks pending (quick mode: 20,000; full: 100,000).

A real ``celery worker --pool=solo --concurrency 1`` consumes the destination
queue. After a warm-up (tasks that ran, so imports and caches are in place)
its RSS is sampled, then N tasks due in about an hour are published and RSS
is sampled again once it stops changing.

Classic ETA hands every pending message to the worker, which keeps it
unacknowledged in memory. For it to hold N pending tasks at all, its
prefetch must allow N ("100k prefetch"): the classic worker runs with a
prefetch multiplier of min(N, 65,535) (a larger one crashes Celery's worker
at start: prefetch_count is 16 bits), and once the ETA tasks it holds raise
the prefetch past 65,535, kombu disables QoS entirely.
(With Celery's default multiplier of 4 it raises prefetch so slowly that
the tasks mostly stay in the queue.) With celery_delayq and Celery native the
messages wait in the broker's ladder and the worker (default multiplier 4)
holds nothing.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

from ..common import queue_depth, queue_depths, rabbitmqctl, vhost
from ..measure import declare, peer_queues, seq_base
from ..peers import make_peer
from ..workers import running_worker
from . import DEFAULT_LADDER, Ctx

NAME = "worker_rss"
TITLE = "Worker memory with pending delayed tasks"

#: How each system's pending tasks are published (fast, and the same messages a user sends).
FILL_MODE = {"classic": "apply_async_unconfirmed", "delayq": "schedule_task_batch", "native": "apply_async"}
WARMUP = 200


def _rss(worker: Any, samples: int = 3) -> float:
    values = []
    for _ in range(samples):
        values.append(worker.rss_mb())
        time.sleep(0.3)
    return statistics.median(values)


def _settle(worker: Any, timeout: float) -> float:
    """Wait until RSS changes by < 0.5 MB over 2 s (or timeout); return it."""
    deadline = time.monotonic() + timeout
    last = worker.rss_mb()
    while time.monotonic() < deadline:
        time.sleep(2.0)
        now = worker.rss_mb()
        if abs(now - last) < 0.5:
            return _rss(worker)
        last = now
    return _rss(worker)


def _unacked(vhost_name: str, queue: str) -> int | None:
    try:
        out = rabbitmqctl("list_queues", "-p", vhost_name, "name", "messages_ready", "messages_unacknowledged")
    except Exception:
        return None
    for line in out.splitlines():
        parts = re.split(r"\s+", line.strip())
        if len(parts) == 3 and parts[0] == queue:
            return int(parts[2])
    return None


def measure(ctx: Ctx, system: str, pending: int) -> dict[str, Any]:
    opts = dict(DEFAULT_LADDER) if system == "delayq" else {}
    with vhost(f"rss-{system}") as vh:
        declare(ctx, vh, system, opts)
        peer = make_peer(system, vh.url, **opts)
        worker_opts: dict[str, Any] = {"delayq": peer.settings} if system == "delayq" else {}  # type: ignore[attr-defined]
        # Celery sends its initial basic.qos unchecked, and AMQP's prefetch_count is 16 bits:
        # 65,535 is the largest multiplier a solo worker starts with. Each ETA task it
        # receives raises the prefetch by one, and past 65,535 kombu turns QoS off.
        prefetch = min(pending, 65_535) if system == "classic" else 4
        with running_worker(peer.worker_system, vh.name, vh.url, peer.dest_queue, label=f"rss-{system}",
                            opts=worker_opts, prefetch=prefetch) as worker:
            started = worker.rss_mb()
            warm = [{"kind": "publish", "peer": system, "mode": FILL_MODE[system], "url": vh.url, "opts": opts,
                     "n": WARMUP, "delay": [1.2, 1.5], "seq_base": seq_base(0, 1), "declare": False, "warmup": 0}]
            ctx.pool.run(warm, timeout=120)
            worker.wait_for(WARMUP, timeout=30)
            time.sleep(1.0)
            before = _rss(worker)
            procs = 8 if system == "native" else 2
            jobs = [{"kind": "publish", "peer": system, "mode": FILL_MODE[system], "url": vh.url, "opts": opts,
                     "n": pending // procs, "delay": [3600.0, 3700.0], "seq_base": seq_base(0, i + 2),
                     "declare": False, "warmup": 0, "seed": i} for i in range(procs)]
            t0 = time.time()
            res = ctx.pool.run(jobs, timeout=1800)
            published = sum(r["n"] for r in res)
            publish_s = time.time() - t0
            # Classic: wait until the worker has taken every message off the queue.
            deadline = time.monotonic() + (120 if ctx.quick else 600)
            while system == "classic" and time.monotonic() < deadline:
                if (queue_depth(worker_conn := vh.connect(), peer.dest_queue) or 0) == 0:
                    worker_conn.close()
                    break
                worker_conn.close()
                time.sleep(0.5)
            after = _settle(worker, timeout=60 if ctx.quick else 180)
            conn = vh.connect()
            try:
                in_ladder = sum(queue_depths(conn, [q for q in peer_queues(system, opts) if q != peer.dest_queue]).values())
                ready = queue_depth(conn, peer.dest_queue)
            finally:
                conn.close()
            unacked = _unacked(vh.name, peer.dest_queue)
    row = {"system": system, "pending": published, "prefetch_multiplier": prefetch, "publish_s": round(publish_s, 1),
           "rss_start_mb": round(started, 1), "rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1),
           "growth_mb": round(after - before, 1), "held_by_worker_unacked": unacked, "ready_in_queue": ready,
           "waiting_in_broker_ladder": in_ladder}
    ctx.log(f"  {system}: {published} pending, RSS {before:.1f} -> {after:.1f} MB ({after - before:+.1f} MB); "
            f"worker holds {unacked}, ladder holds {in_ladder}")
    return row


def run(ctx: Ctx) -> dict[str, Any]:
    rows = [measure(ctx, system, ctx.cfg.rss_pending) for system in ctx.cfg.rss_systems]
    return {"rows": rows, "pending": ctx.cfg.rss_pending,
            "scaled": ctx.cfg.rss_pending != 100_000,
            "note": None if ctx.cfg.rss_pending == 100_000 else
            f"quick mode: {ctx.cfg.rss_pending:,} pending instead of 100,000 (growth is not extrapolated)"}
