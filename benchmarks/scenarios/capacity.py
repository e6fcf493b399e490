"""Item 6 (full mode only): 1,000,000 pending delayed messages.

Several processes publish through the kombu-level batch path
(``Scheduler.schedule`` in ``scheduler.batch()``, confirms pipelined)
with delays long enough that every message is still pending when the last
one is published. Measured: time to publish, broker memory
(``erlang:memory(total)``) before, with everything pending and after, the
ladder depth over time, and the time until a raw consumer received all of
them (with loss and duplicates). The vhost, and with it every message, is
deleted at the end even if the delivery did not finish within the cap.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..common import broker_memory_bytes, vhost
from ..measure import DepthSampler, declare, peer_queues, seq_base, single_rate
from . import DEFAULT_LADDER, Ctx

NAME = "capacity"
TITLE = "Capacity: 1,000,000 pending"


class MemorySampler:
    """Samples the broker's total memory every ``interval`` s (rabbitmqctl, so sparingly)."""

    def __init__(self, interval: float = 15.0) -> None:
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            mem = broker_memory_bytes()
            if mem is not None:
                self.samples.append((time.time(), mem))
            self._stop.wait(self.interval)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def run(ctx: Ctx) -> dict[str, Any]:
    c = ctx.cfg
    n = c.capacity_n
    if not n:
        return {"skipped": "full mode only"}
    opts = dict(DEFAULT_LADDER, prefix="dqcap")
    procs = c.capacity_procs
    est_rate = max(2000.0, single_rate(ctx, "delayq", "schedule_batch"))
    est_publish = n / est_rate
    lo = est_publish * 1.5 + 60
    delay = (lo, lo + 60.0)
    mem_before = broker_memory_bytes()
    with vhost("cap") as vh:
        declare(ctx, vh, "delayq", opts)
        dest = "dqbench.delayq"
        ladder = [q for q in peer_queues("delayq", opts) if q != dest]
        consumer = {"kind": "consume", "url": vh.url, "queue": dest, "summary": True, "prefetch": 5000,
                    "max_seconds": delay[1] + c.capacity_max_delivery_s}
        pubs = [{"kind": "publish", "peer": "delayq", "mode": "schedule_batch", "url": vh.url, "opts": opts,
                 "n": n // procs, "delay": list(delay), "seed": i, "seq_base": seq_base(900, i + 1),
                 "declare": False, "warmup": 0, "max_seconds": delay[0] * 0.9} for i in range(procs)]
        ctx.log(f"  publishing {n:,} with delays {delay[0]:.0f}-{delay[1]:.0f} s from {procs} processes")
        with DepthSampler(vh, ladder, interval=5.0) as depth, MemorySampler() as mem:
            running = ctx.pool.start([consumer] + pubs)
            go = running.go()
            res = running.results(delay[0] * 2 + 600, members=range(1, procs + 1))
            published = sum(r["n"] for r in res)
            publish_end = max(r["t1"] for r in res)
            ctx.log(f"  published {published:,} in {publish_end - go:.0f} s; waiting for delivery")
            time.sleep(5.0)
            mem_pending = broker_memory_bytes()
            running.send(0, {"op": "expect", "n": published, "timeout": delay[1] + c.capacity_max_delivery_s})
            cons = running.result(0, delay[1] + c.capacity_max_delivery_s + 300)
        mem_after = broker_memory_bytes()
    mem_peak = max([m for _t, m in mem.samples] + [mem_pending or 0])
    last = cons.get("last_arrival")
    first_due = go + delay[0]
    out = {
        "n": n, "published": published, "publish_processes": procs, "delay_s": list(delay),
        "publish_s": round(publish_end - go, 1), "publish_rate": round(published / (publish_end - go), 1),
        "peak_in_ladder": depth.peak(),
        "broker_memory_mb": {"before": _mb(mem_before), "all_pending": _mb(mem_pending), "peak": _mb(mem_peak),
                             "after_delete": _mb(mem_after)},
        "bytes_per_pending_message": round(((mem_pending or 0) - (mem_before or 0)) / max(1, published), 1),
        "received": cons["received"], "lost": published - cons["received"], "duplicates": cons["duplicates"],
        "all_delivered": cons["received"] >= published,
        "delivery_s_after_first_due": round(last - first_due, 1) if last else None,
        "delivered_per_s": round(cons["received"] / (last - cons["first_arrival"]), 1) if last else None,
        "lateness": cons.get("lateness"), "mean_dead_letterings": cons.get("mean_deaths"),
        "ladder_depth_samples": [(round(t - go, 1), d) for t, d in depth.samples[:: max(1, len(depth.samples) // 60)]],
    }
    ctx.log(f"  delivered {cons['received']:,}/{published:,}; broker memory {out['broker_memory_mb']}")
    return out


def _mb(x: int | None) -> float | None:
    return None if x is None else round(x / 2**20, 1)
