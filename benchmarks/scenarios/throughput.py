"""Item 1: confirmed scheduling throughput (durable delayed publishes/s), 1 process and 8.

Every system is measured in the same run, one after another, with delays of
600-610 s so no message dead-letters while publishing (queues are purged
after each measurement). Single-process cases run in interleaved rounds and
the best round counts (the least disturbed by other load on the shared
broker); all rounds are kept in the JSON. The machine references (item 7) run in separate
"pure" child processes that never import celery_delayq, so Celery's own
``send_task`` rate is measured without celery_delayq's producer hook.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..common import vhost
from ..measure import throughput
from ..pool import ChildPool
from . import DEFAULT_LADDER, Ctx

NAME = "throughput"
TITLE = "Scheduling throughput"

#: (peer, mode, run with 8 processes too?, repeated in rounds? (the inputs of a target ratio))
CASES: tuple[tuple[str, str, bool, bool], ...] = (
    ("baseline", "raw_pipelined", True, True),
    ("baseline", "send_task_unconfirmed", True, True),
    ("baseline", "raw_confirm_each", False, False),
    ("baseline", "send_task_confirmed", False, True),
    ("native", "apply_async", True, True),
    ("classic", "apply_async", True, False),
    ("naive", "publish", True, False),
    ("delayq", "apply_async", True, True),
    ("delayq", "apply_async_batch", True, True),
    ("delayq", "publish_batch", True, True),
    ("delayq", "schedule_batch", True, True),
)


def run(ctx: Ctx) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    rounds = ctx.cfg.tp_rounds
    with vhost("tp") as vh, ChildPool(max(ctx.cfg.tp_procs), pure=True) as pure:
        for procs in ctx.cfg.tp_procs:
            samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for rnd in range(rounds if procs == 1 else 1):  # interleaved rounds: A B C .. A B C
                for peer, mode, multi, repeat in CASES:
                    if (procs > 1 and not multi) or (rnd > 0 and not repeat):
                        continue
                    opts = dict(DEFAULT_LADDER) if peer == "delayq" else {}
                    row = throughput(ctx, vh, peer, mode, procs, opts=opts,
                                     pool=pure if peer == "baseline" else None)
                    ctx.log(f"  {peer}:{mode} x{procs}{f' round {rnd + 1}' if procs == 1 else ''}: "
                            f"{row['rate']:.0f}/s ({row['n']} in {row['seconds']} s)")
                    samples.setdefault((peer, mode), []).append(row)
            for runs in samples.values():
                best = max(runs, key=lambda r: r["rate"])
                rows.append({**best, "samples": [r["rate"] for r in runs],
                             "median": round(statistics.median(r["rate"] for r in runs), 1)})
    return {"rows": rows, "delay_s": list(ctx.cfg.tp_delay), "rounds": rounds,
            "statistic": f"best of {rounds} interleaved rounds for the single-process inputs of a target "
                         "ratio, one run otherwise (and with 8 processes)"}


def rate_of(results: dict[str, Any], peer: str, mode: str, procs: int = 1) -> float | None:
    """Measured rate of one case, or None if it was not run."""
    for row in (results.get("throughput") or {}).get("rows", []):
        if row["peer"] == peer and row["mode"] == mode and row["procs"] == procs:
            return float(row["rate"])
    return None
