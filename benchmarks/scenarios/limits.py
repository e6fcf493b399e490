"""Item 7: the machine's own limits, the denominators of the ratios.

* Raw dead-letter rate of ONE TTL queue (quorum with at-least-once dead-lettering,
  as the ladder uses, and classic). All messages are made to expire at the same
  instant (per-message ``expiration`` counting down to a common deadline), so the
  broker dead-letters a full queue as fast as it can; the rate is taken between
  10 % and 90 % of the sink's depth.
* Raw routing ceiling of the ladder: py-amqp publishes (500 confirms in flight)
  straight into the default ladder's entry exchanges with ladder routing keys,
  no celery_delayq code, so it bounds every delayq publish path.

The raw pipelined-confirm rate into a single queue and Celery's unconfirmed
``send_task`` rate are measured by the throughput scenario (baseline peer), in
the same run and with the same process counts as the systems.
"""

from __future__ import annotations

import random
import time
from typing import Any

import amqp

from ..common import queue_depth, vhost
from . import DEFAULT_LADDER, Ctx

NAME = "limits"
TITLE = "Machine limits"


def dead_letter_limit(vh_name: str, queue_type: str, n: int) -> dict[str, Any]:
    """Dead-letter ``n`` simultaneously expiring messages from one queue into a sink."""
    from ..common import connect

    conn = connect(vh_name)
    ch = conn.channel()
    ch.confirm_select()
    src, sink = f"dqbench.dl.{queue_type}", f"dqbench.dlsink.{queue_type}"
    args: dict[str, Any] = {"x-queue-type": queue_type, "x-dead-letter-exchange": "",
                            "x-dead-letter-routing-key": sink}
    if queue_type == "quorum":
        args.update({"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
    ch.queue_declare(src, durable=True, auto_delete=False, arguments=args)
    ch.queue_declare(sink, durable=True, auto_delete=False, arguments={"x-queue-type": queue_type})
    acked = [0]
    ch.events["basic_ack"].add(lambda tag, multiple: acked.__setitem__(0, max(acked[0], tag)))
    body = b"x" * 300
    expire_at = time.time() + n / 5000.0 + 1.5  # publishing must finish before this
    t0 = time.time()
    for i in range(1, n + 1):
        ttl = max(0, int((expire_at - time.time()) * 1000))
        ch.basic_publish(amqp.Message(body, delivery_mode=2, expiration=str(ttl)), exchange="", routing_key=src)
        while i - acked[0] >= 500:
            conn.drain_events(timeout=30)
    while acked[0] < n:
        conn.drain_events(timeout=30)
    published_at = time.time()
    samples: list[tuple[float, int]] = []
    deadline = expire_at + 120
    while time.time() < deadline:
        depth = queue_depth(conn, sink) or 0
        samples.append((time.time(), depth))
        if depth >= n:
            break
        time.sleep(0.02)
    ch.queue_delete(src)
    ch.queue_delete(sink)
    conn.close()
    done = samples[-1][1] if samples else 0
    out: dict[str, Any] = {"queue_type": queue_type, "n": n, "publish_rate": round(n / (published_at - t0), 1),
                           "published_before_expiry": published_at < expire_at, "dead_lettered": done}
    if done >= n * 0.9:
        t10 = next(t for t, d in samples if d >= n * 0.1)
        t90 = next(t for t, d in samples if d >= n * 0.9)
        out["rate"] = round(0.8 * n / (t90 - t10), 1) if t90 > t10 else None
    return out


def job_raw_ladder(proto: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Child job: raw pipelined publishes into a ladder's entry exchanges (routing ceiling)."""
    import kombu

    from celery_delayq import DelayqConfig, LadderPublisher

    from ..child import raw_connection
    from ..peers.delayq import ladder_settings

    cfg = DelayqConfig(**ladder_settings(job["opts"]))
    pub = LadderPublisher(kombu.Connection(job["url"]), cfg)
    topo = pub.declare()
    dest = job["queue"]
    conn = raw_connection(job["url"])
    ch = conn.channel()
    ch.queue_declare(dest, durable=True, auto_delete=False)
    dst = topo.destination("", dest)
    topo.ensure_exit(conn, dst, declare=True)
    spec = cfg.spec
    rng = random.Random(1)
    lo, hi = job["delay"]
    n = int(job["n"])
    keys = []
    for _ in range(n):
        units = spec.units_for(rng.uniform(lo, hi))
        keys.append((spec.entry_exchange(units), spec.routing_key(units, dst.token)))
    ch.confirm_select()
    acked = [0]
    ch.events["basic_ack"].add(lambda tag, multiple: acked.__setitem__(0, max(acked[0], tag)))
    body = b'{"due": 0, "seq": 0}'
    proto.ready()
    t0 = time.time()
    for i, (x, k) in enumerate(keys, 1):
        ch.basic_publish(amqp.Message(body, delivery_mode=2), exchange=x, routing_key=k, mandatory=True)
        while i - acked[0] >= 500:
            conn.drain_events(timeout=30)
    while acked[0] < n:
        conn.drain_events(timeout=30)
    t1 = time.time()
    for _k, _d, name, _s in spec.level_queues():
        ch.queue_purge(name)
    conn.close()
    pub.close()
    return {"n": n, "rate": round(n / (t1 - t0), 1), "routing_key_words": len(keys[0][1].split("."))}


def raw_ladder_ceiling(ctx: Ctx, vh_url: str, opts: dict[str, Any], n: int) -> dict[str, Any]:
    """Routing ceiling of the ladder described by ``opts`` (one process)."""
    job = {"kind": "call", "handler": "benchmarks.scenarios.limits:job_raw_ladder", "url": vh_url,
           "opts": opts, "queue": "dqbench.delayq", "delay": list(ctx.cfg.tp_delay), "n": n}
    return ctx.pool.run([job], timeout=300)[0]


def run(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with vhost("limits") as vh:
        for qt in ("quorum", "classic"):
            ctx.log(f"  dead-letter limit, one {qt} TTL queue, {ctx.cfg.dl_n} messages")
            out[f"dead_letter_{qt}"] = dead_letter_limit(vh.name, qt, ctx.cfg.dl_n)
        ctx.log("  raw routing ceiling of the default ladder")
        out["raw_ladder_publish"] = raw_ladder_ceiling(ctx, vh.url, dict(DEFAULT_LADDER, prefix="dqlim"),
                                                       10_000 if ctx.quick else 40_000)
    return out
