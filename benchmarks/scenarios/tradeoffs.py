"""Design trade-offs: radix, unit and queue type of the ladder, measured side by side.

For every variant (in a vhost of its own, deleted afterwards, so quorum
queues never pile up past the broker's file-handle limit):

* shape: levels, queues, maximum delay;
* raw routing ceiling: py-amqp pipelined publishes into its entry exchanges
  (a longer routing key costs the topic exchange more);
* saturation: the same burst as the broker-cost scenario, so delivered/s,
  dead-letterings per message and dead-letters/s compare directly;
* lateness at 1,000 msgs/s at the queue (full mode, or quick when time allows).

The shipped default (radix 2, 10 ms, quorum) is taken from the limits,
broker-cost and lateness scenarios of the same run.
"""

from __future__ import annotations

from typing import Any

from ..common import vhost
from ..measure import lateness_at_queue, saturation
from ..peers.delayq import describe
from . import DEFAULT_LADDER, Ctx
from .limits import raw_ladder_ceiling

NAME = "tradeoffs"
TITLE = "Ladder design trade-offs"

LATENESS_RATE = 1000


def _default_row(ctx: Ctx) -> dict[str, Any]:
    row: dict[str, Any] = {"variant": describe(dict(DEFAULT_LADDER)), "default": True}
    limits = ctx.results.get("limits") or {}
    if "raw_ladder_publish" in limits:
        row["raw_ladder_publish"] = limits["raw_ladder_publish"]
    sat = (ctx.results.get("broker_cost") or {}).get("saturation")
    if sat:
        row["saturation"] = sat
    for lat in (ctx.results.get("lateness") or {}).get("rows", []):
        if lat["peer"] == "delayq" and lat["at"] == "queue" and lat["offered"] == LATENESS_RATE and "p99_ms" in lat:
            row["lateness_1000"] = lat
    return row


def measure_variant(ctx: Ctx, opts: dict[str, Any], *, lateness: bool) -> dict[str, Any]:
    c = ctx.cfg
    label = f"r{opts['radix']}u{opts['unit_ms']}{opts['queue_type'][0]}" + (f"s{opts['shards']}" if opts.get("shards") else "")
    opts = dict(opts, prefix=f"dqv{label}")
    row: dict[str, Any] = {"variant": describe(opts), "default": False}
    with vhost(f"var-{label}") as vh:
        row["raw_ladder_publish"] = raw_ladder_ceiling(ctx, vh.url, opts, 5_000 if ctx.quick else 30_000)
        row["saturation"] = saturation(ctx, vh, opts, c.sat_n, c.sat_d0, c.sat_width)
        if lateness:
            row["lateness_1000"] = lateness_at_queue(ctx, vh, "delayq", "publish_batch", LATENESS_RATE, opts=opts)
    sat = row["saturation"]
    lat = row.get("lateness_1000") or {}
    ctx.log(f"  {row['variant']['label']}: {row['variant']['queues']} queues, raw publish "
            f"{row['raw_ladder_publish']['rate']:.0f}/s, saturation {sat.get('delivered_per_s')}/s x "
            f"{sat.get('mean_dead_letterings')} = {sat.get('dead_letters_per_s')} DL/s"
            + (f", lateness@1000 p99 {lat.get('p99_ms')} ms" if lat else ""))
    return row


def run(ctx: Ctx) -> dict[str, Any]:
    rows = [_default_row(ctx)]
    per_variant = 15.0 if ctx.quick else 120.0
    for opts in ctx.cfg.variants:
        if ctx.budget.left() < per_variant:
            rows.append({"variant": describe(opts), "skipped": "time budget"})
            ctx.log(f"  {describe(opts)['label']}: skipped (time budget)")
            continue
        lateness = ctx.cfg.variant_lateness or ctx.budget.left() > per_variant + 60
        rows.append(measure_variant(ctx, opts, lateness=lateness))
    return {"rows": rows, "lateness_rate": LATENESS_RATE,
            "saturation_burst": {"n": ctx.cfg.sat_n, "due_window_s": [ctx.cfg.sat_d0, ctx.cfg.sat_d0 + ctx.cfg.sat_width]}}
