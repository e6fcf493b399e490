"""Measurement building blocks shared by several scenarios.

* :func:`throughput` - N confirmed delayed publishes from 1 or more processes at once.
* :func:`lateness_at_queue` - steady offered rate, raw consumer on the destination queue.
* :func:`lateness_via_worker` - steady offered rate, arrival recorded by a real Celery worker.
* :func:`saturation` - a burst that keeps the ladder busy: delivered/s and dead-letters/s.

Every function returns plain dicts (JSON-ready) with the inputs echoed back.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from typing import Any, Sequence

from .common import ForeignLoad, Vhost, arrival_bursts, lateness_stats, percentile, purge, queue_depths
from .peers import make_peer

#: Rough single-process rates used only to size runs before anything was measured.
DEFAULT_RATES: dict[str, float] = {
    "baseline:raw_pipelined": 25000, "baseline:raw_confirm_each": 1500, "baseline:send_task_unconfirmed": 3500,
    "baseline:send_task_confirmed": 1200, "classic:now": 500,
    "native:apply_async": 300, "classic:apply_async": 400, "classic:apply_async_unconfirmed": 3000,
    "naive:publish": 500, "delayq:apply_async": 600, "delayq:apply_async_batch": 1500,
    "delayq:publish_batch": 6000, "delayq:schedule_batch": 7000, "delayq:schedule_task_batch": 3000,
}

_RUN_IDS = itertools.count(1)


def seq_base(run: int, proc: int) -> int:
    """Sequence numbers unique across runs and processes of one benchmark."""
    return run * 1_000_000_000 + proc * 10_000_000


def peer_queues(peer: str, opts: dict[str, Any] | None = None) -> list[str]:
    """Queues of ``peer`` (to purge between runs)."""
    return make_peer(peer, "amqp://unused/", **(opts or {})).queues()


def declare(ctx: Any, vh: Vhost, peer: str, opts: dict[str, Any] | None = None) -> None:
    """Declare ``peer``'s topology from a child process."""
    ctx.pool.run([{"kind": "declare", "peer": peer, "url": vh.url, "opts": opts or {}}], timeout=120)


def single_rate(ctx: Any, peer: str, mode: str) -> float:
    """Best known single-process rate of ``peer:mode`` (measured this run, else a default)."""
    measured = ctx.results.get("_rates", {}).get(f"{peer}:{mode}")
    return float(measured or DEFAULT_RATES.get(f"{peer}:{mode}", 500))


def ensure_declared(ctx: Any, vh: Vhost, peer: str, opts: dict[str, Any] | None = None) -> None:
    """Declare ``peer`` in ``vh`` once per run (publish jobs then skip their own declare)."""
    key = (vh.name, peer, tuple(sorted((opts or {}).items())))
    done = ctx.results.setdefault("_declared", set())
    if key not in done:
        declare(ctx, vh, peer, opts)
        done.add(key)


def throughput(ctx: Any, vh: Vhost, peer: str, mode: str, procs: int, *, opts: dict[str, Any] | None = None,
               seconds: float | None = None, pool: Any = None) -> dict[str, Any]:
    """Confirmed delayed publishes/s of ``peer`` in ``mode`` from ``procs`` processes at once.

    The run is sized from the best single-process rate known so far to last
    about ``seconds`` (capped by the mode's ``tp_max_seconds``).
    """
    pool = pool or ctx.pool
    cfg = ctx.cfg
    seconds = seconds or cfg.tp_seconds
    ensure_declared(ctx, vh, peer, opts)
    cores = 2.0  # more processes than cores rarely add more than that
    expected = single_rate(ctx, peer, mode) * (1.0 if procs == 1 else cores)
    total = max(100 * procs, int(expected * seconds))
    per = max(50, total // procs)
    run = next(_RUN_IDS)
    jobs = [{"kind": "publish", "peer": peer, "mode": mode, "url": vh.url, "opts": opts or {}, "n": per,
             "delay": list(cfg.tp_delay), "seed": run * 100 + i, "seq_base": seq_base(run, i),
             "max_seconds": cfg.tp_max_seconds, "declare": False} for i in range(procs)]
    results = pool.run(jobs, timeout=cfg.tp_max_seconds * 4 + 120)
    n = sum(r["n"] for r in results)
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    conn = vh.connect()
    try:
        purge(conn, peer_queues(peer, opts))
    finally:
        conn.close()
    rate = n / (t1 - t0) if t1 > t0 else 0.0
    if procs == 1:
        rates = ctx.results.setdefault("_rates", {})
        rates[f"{peer}:{mode}"] = max(rate, rates.get(f"{peer}:{mode}", 0.0))
    return {"peer": peer, "mode": mode, "procs": procs, "n": n, "seconds": round(t1 - t0, 3),
            "rate": round(rate, 1), "per_process": [round(r["rate"], 1) for r in results],
            "capped": any(r.get("capped") for r in results)}


def publishers_for(ctx: Any, peer: str, mode: str, rate: float, limit: int) -> int:
    """Paced publisher processes needed to offer ``rate`` (at 60 % of one process's best)."""
    return max(1, min(limit, math.ceil(rate / (0.6 * single_rate(ctx, peer, mode)))))


def _paced_jobs(vh: Vhost, peer: str, mode: str, rate: float, duration: float, delay: Sequence[float],
                opts: dict[str, Any] | None, procs: int, run: int) -> list[dict[str, Any]]:
    return [{"kind": "paced", "peer": peer, "mode": mode, "url": vh.url, "opts": opts or {},
             "rate": rate / procs, "duration": duration, "delay": list(delay), "seed": run * 100 + i,
             "seq_base": seq_base(run, i + 1), "declare": False} for i in range(procs)]


def _verdict(offered: float, achieved: float, missing: int, stats: dict[str, Any]) -> bool:
    """Sustained = the offered rate was achieved, nothing lost, p99 <= 100 ms, nothing early."""
    p99 = stats.get("p99_ms")
    return (achieved >= 0.95 * offered and missing == 0 and p99 is not None and p99 <= 100.0
            and stats.get("early", 0) == 0)


def lateness_at_queue(ctx: Any, vh: Vhost, peer: str, mode: str, rate: float, *,
                      opts: dict[str, Any] | None = None, duration: float | None = None,
                      delay: Sequence[float] | None = None) -> dict[str, Any]:
    """Offer ``rate`` delayed msgs/s; a raw consumer on the destination records arrivals."""
    cfg = ctx.cfg
    duration = duration or cfg.lat_duration
    delay = delay or cfg.lat_delay
    procs = publishers_for(ctx, peer, mode, rate, len(ctx.pool.children) - 1)
    run = next(_RUN_IDS)
    dest = make_peer(peer, vh.url, **(opts or {})).dest_queue
    grace = 10.0 + delay[1]
    consumer = {"kind": "consume", "url": vh.url, "queue": dest, "max_seconds": duration * 1.5 + delay[1] + grace + 30}
    running = ctx.pool.start([consumer] + _paced_jobs(vh, peer, mode, rate, duration, delay, opts, procs, run))
    with ForeignLoad() as foreign:
        running.go()
        pubs = running.results(duration * 3 + 60, members=range(1, procs + 1))
        published = sum(p["n"] for p in pubs)
        running.send(0, {"op": "expect", "n": published, "timeout": delay[1] + grace})
        cons = running.result(0, duration * 2 + delay[1] + grace + 60)
    return _lateness_result(peer, mode, "queue", rate, duration, delay, procs, pubs, cons["records"],
                            published, cons.get("duplicates", 0), foreign.fraction)


def lateness_via_worker(ctx: Any, vh: Vhost, worker: Any, peer: str, mode: str, rate: float, *,
                        opts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Offer ``rate`` delayed tasks/s; the (already running) Celery worker records when each ran."""
    cfg = ctx.cfg
    duration, delay = cfg.lat_duration, cfg.lat_delay
    procs = publishers_for(ctx, peer, mode, rate, len(ctx.pool.children))
    run = next(_RUN_IDS)
    before = worker.count()
    running = ctx.pool.start(_paced_jobs(vh, peer, mode, rate, duration, delay, opts, procs, run))
    with ForeignLoad() as foreign:
        running.go()
        pubs = running.results(duration * 3 + 60)
        published = sum(p["n"] for p in pubs)
        warmups = procs  # one warm-up task per publisher (seq < 0)
        worker.wait_for(before + published + warmups, timeout=delay[1] + 15.0 + duration)
    lo, hi = seq_base(run, 0), seq_base(run + 1, 0)
    records = [[s, d, a, h, None] for s, d, a, h in worker.records() if lo <= s < hi]
    return _lateness_result(peer, mode, "worker", rate, duration, delay, procs, pubs, records, published, 0,
                            foreign.fraction)


def _lateness_result(peer: str, mode: str, where: str, rate: float, duration: float, delay: Sequence[float],
                     procs: int, pubs: list[dict[str, Any]], records: list[list[Any]], published: int,
                     duplicates: int, foreign: float) -> dict[str, Any]:
    achieved = sum(p["achieved"] for p in pubs)
    stats = {**lateness_stats([r[2] - r[1] for r in records]), **arrival_bursts([r[2] for r in records])}
    received = len({r[0] for r in records})
    missing = max(0, published - received)
    hops = [r[3] for r in records if isinstance(r[3], (int, float)) and r[3] >= 0]
    deaths = [r[4] for r in records if isinstance(r[4], (int, float))]
    return {
        "peer": peer, "mode": mode, "at": where, "offered": rate, "achieved": round(achieved, 1),
        "publishers": procs, "duration_s": duration, "delay_s": list(delay), "published": published,
        "received": received, "missing": missing, "duplicates": duplicates, **stats,
        "mean_hops_header": round(sum(hops) / len(hops), 2) if hops else None,
        "mean_dead_letterings": round(sum(deaths) / len(deaths), 2) if deaths else None,
        "sustained": _verdict(rate, achieved, missing, stats),
        "foreign_cpu": round(foreign, 3),
    }


class DepthSampler:
    """Samples the total depth of some queues every ``interval`` s in a thread (AMQP passive declares)."""

    def __init__(self, vh: Vhost, queues: list[str], interval: float = 0.5) -> None:
        self.vh, self.queues, self.interval = vh, queues, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = self.vh.connect()
        try:
            while not self._stop.is_set():
                depths = queue_depths(conn, self.queues)
                self.samples.append((time.time(), sum(depths.values())))
                self._stop.wait(self.interval)
        finally:
            conn.close()

    def __enter__(self) -> "DepthSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def peak(self) -> int:
        return max((d for _t, d in self.samples), default=0)


def saturation(ctx: Any, vh: Vhost, opts: dict[str, Any], n: int, d0: float, width: float,
               procs: int = 2) -> dict[str, Any]:
    """Load ``n`` messages due within ``[d0, d0+width]`` s, faster than the ladder can move them.

    Publishing (kombu-level ``schedule`` in batches) finishes before the first
    message is due, so the ladder then runs flat out on its own. Sustained
    throughput is the delivery rate between the 10th and 90th percentile of
    arrivals; dead-letter operations/s = that rate times the broker-counted
    dead-letterings per message (``x-death``).
    """
    declare(ctx, vh, "delayq", opts)
    run = next(_RUN_IDS)
    dest = make_peer("delayq", vh.url, **opts).dest_queue
    consumer = {"kind": "consume", "url": vh.url, "queue": dest, "max_seconds": 900}
    per = n // procs
    pubs = [{"kind": "publish", "peer": "delayq", "mode": "schedule_batch", "url": vh.url, "opts": opts,
             "n": per, "delay": [d0, d0 + width], "seed": run * 100 + i, "seq_base": seq_base(run, i + 1),
             "declare": False, "warmup": 0, "max_seconds": d0 * 0.9} for i in range(procs)]
    ladder_queues = [q for q in peer_queues("delayq", opts) if q != dest]
    with DepthSampler(vh, ladder_queues) as sampler:
        running = ctx.pool.start([consumer] + pubs)
        go = running.go()
        pub_res = running.results(d0 * 3 + 60, members=range(1, procs + 1))
        published = sum(p["n"] for p in pub_res)
        publish_end = max(p["t1"] for p in pub_res)
        running.send(0, {"op": "expect", "n": published, "timeout": 600})
        cons = running.result(0, 900)
    recs = cons["records"]
    arrivals = sorted(r[2] for r in recs)
    m = len(arrivals)
    out: dict[str, Any] = {"opts": opts, "n": n, "published": published, "received": cons["received"],
                           "duplicates": cons.get("duplicates", 0), "due_window_s": [d0, d0 + width],
                           "publish_s": round(publish_end - go, 2),
                           "publish_rate": round(published / max(1e-9, publish_end - go), 1),
                           "publish_overlapped_delivery": publish_end - go > d0,
                           "peak_in_ladder": sampler.peak()}
    if m < 10:
        return {**out, "error": "too few deliveries"}
    t10, t90 = arrivals[int(m * 0.1)], arrivals[int(m * 0.9)]
    thr = 0.8 * m / (t90 - t10) if t90 > t10 else float("inf")
    hops = [r[3] for r in recs if isinstance(r[3], (int, float))]
    deaths = [r[4] for r in recs]
    mean_deaths = sum(deaths) / len(deaths)
    offered_expiry = published / width
    out.update({
        "delivered_per_s": round(thr, 1),
        "offered_expiry_per_s": round(offered_expiry, 1),
        "saturated": thr < 0.8 * offered_expiry,
        "mean_hops_header": round(sum(hops) / len(hops), 2) if hops else None,
        "mean_dead_letterings": round(mean_deaths, 2),
        "dead_letters_per_s": round(thr * mean_deaths, 1),
        "drain_s": round(arrivals[-1] - (go + d0), 2),
        "lateness": lateness_stats([r[2] - r[1] for r in recs]),
        "p50_arrival_spread_s": round((percentile(arrivals, 50) or 0) - arrivals[0], 2),
    })
    return out
