"""Item 4: head-of-line blocking. A long-delay message, then at once a 1 s one.

All four systems run at the same time (each has its own queues): a raw
consumer for celery_delayq, Celery native and the naive TTL queue, a real
worker for classic ETA. Without head-of-line blocking the 1 s message
arrives after ~1 s, before the long one; the naive per-message-TTL queue
holds it behind the long one.
"""

from __future__ import annotations

import time
from typing import Any

from ..common import vhost
from ..measure import declare
from ..peers import make_peer
from ..workers import running_worker
from . import DEFAULT_LADDER, Ctx

NAME = "hol"
TITLE = "Head-of-line blocking"

SHORT = 1.0
RAW = ("delayq", "native", "naive")
MODES = {"delayq": "apply_async", "native": "apply_async", "naive": "publish", "classic": "apply_async"}


def job_pair(proto: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Child job: publish the long message, then immediately the short one."""
    from ..peers import make_peer as mk

    peer = mk(job["peer"], job["url"], **job["opts"])
    pub = peer.publisher(job["mode"])
    base = int(job["seq_base"])
    pub.send(time.time() + 0.5, -1)  # warm-up: connections and declarations (ignored by consumers)
    time.sleep(0.7)  # ... and gone from the naive queue's head before the pair is published
    proto.ready()
    t_long = time.time()
    pub.send(t_long + float(job["long"]), base + 0)
    t_short = time.time()
    pub.send(t_short + SHORT, base + 1)
    pub.close()
    return {"long_published": t_long, "short_published": t_short}


def _row(peer: str, pair: dict[str, Any], records: list[tuple[int, float, float]], long_s: float) -> dict[str, Any]:
    by_seq = {seq % 10: (due, arrival) for seq, due, arrival in records}
    out: dict[str, Any] = {"peer": peer, "long_s": long_s, "short_s": SHORT}
    if 1 in by_seq:
        due, arrival = by_seq[1]
        out["short_arrived_after_s"] = round(arrival - pair["short_published"], 3)
        out["short_lateness_ms"] = round((arrival - due) * 1000, 1)
    if 0 in by_seq:
        due, arrival = by_seq[0]
        out["long_arrived_after_s"] = round(arrival - pair["long_published"], 3)
        out["long_lateness_ms"] = round((arrival - due) * 1000, 1)
    short_late = out.get("short_lateness_ms")
    out["blocked"] = short_late is None or short_late > 500.0
    return out


def run(ctx: Ctx) -> dict[str, Any]:
    long_s = ctx.cfg.hol_long
    rows = []
    with vhost("hol") as vh:
        opts = {p: (dict(DEFAULT_LADDER) if p == "delayq" else {}) for p in MODES}
        for p in MODES:
            declare(ctx, vh, p, opts[p])
        classic = make_peer("classic", vh.url)
        with running_worker("classic", vh.name, vh.url, classic.dest_queue, label="hol-classic") as worker:
            consumers = [{"kind": "consume", "url": vh.url, "queue": make_peer(p, vh.url, **opts[p]).dest_queue,
                          "expect": 2, "max_seconds": long_s + 20} for p in RAW]
            pairs = [{"kind": "call", "handler": "benchmarks.scenarios.hol:job_pair", "peer": p, "mode": MODES[p],
                      "url": vh.url, "opts": opts[p], "long": long_s, "seq_base": 10 * (i + 1)}
                     for i, p in enumerate(MODES)]
            running = ctx.pool.start(consumers + pairs)
            running.go()
            pair_res = running.results(60, members=range(len(consumers), len(consumers) + len(pairs)))
            cons_res = running.results(long_s + 60, members=range(len(consumers)))
            worker.wait_for(3, timeout=long_s + 20)  # the pair and the warm-up
            worker_recs = [(s, d, a) for s, d, a, _h in worker.records()]
        for i, p in enumerate(MODES):
            if p in RAW:
                recs = [(r[0], r[1], r[2]) for r in cons_res[RAW.index(p)]["records"]]
                where = "queue"
            else:
                recs = [r for r in worker_recs if 10 * (i + 1) <= r[0] < 10 * (i + 2)]
                where = "worker"
            row = _row(p, pair_res[i], recs, long_s)
            row["at"] = where
            rows.append(row)
            ctx.log(f"  {p}@{where}: 1 s message after {row.get('short_arrived_after_s')} s, "
                    f"{long_s:.0f} s message after {row.get('long_arrived_after_s')} s"
                    f"{' -> BLOCKED' if row['blocked'] else ''}")
    return {"rows": rows, "long_s": long_s, "short_s": SHORT, "concurrent_with": ctx.concurrent_with}
