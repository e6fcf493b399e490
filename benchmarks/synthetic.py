"""Realistic synthetic telemetry, built by Spark from ``spark.range`` (the analytics tests, benchmark, README screenshots;
not shipped: no part of the package uses it).

Model (per *chain* = one task id):

* a task is picked by Zipf-like weight; each has its own failure probability, retry limit,
  typical countdown and exception mix;
* attempt ``a`` is ``scheduled`` with ``delay_s = delay0 * 2**a``, ``delivered`` at
  ``due_at + lateness``, then ``retried``/``succeeded``/``exhausted``; an exhausted chain is
  ``parked`` (some ``replayed`` ten minutes later) or ``failed``; ~1% of single runs fail
  outright and 0.5% are ``cancelled`` (revoked) instead of ``delivered``;
* lateness is a few ms plus an exponential tail growing with the delay, capped at 1.5 s;
  ~1% of deliveries are slightly early;
* optionally an *incident*: one task's dependency is down for a while and retries pile up.

Chain structure comes from a seeded table of :data:`BLOCK_CHAINS` chains, repeated; jitter
from hashes of (chain id, attempt, seed): deterministic per ``seed``, exactly ``n_events``
events, plus ``malformed`` broken lines in a separate file.
"""

from __future__ import annotations

import bisect
import math
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from celery_delayq.analytics.session import session_scope

__all__ = ["BLOCK_CHAINS", "DEFAULT_START_TS", "INCIDENT_TASK", "INCIDENT_WINDOW", "MALFORMED_SAMPLES", "generate"]

#: 2024-01-01T00:00:00Z.
DEFAULT_START_TS = 1_704_067_200.0
#: Chains in the seeded structure table that repeats over the output.
BLOCK_CHAINS = 1024
#: The task whose dependency has an outage, and when (fractions of the span).
INCIDENT_TASK = "crm.sync_contact"
INCIDENT_WINDOW = (0.55, 0.62)
#: Below this many blocks (~4k events each) there is no incident (small test sets stay steady).
INCIDENT_MIN_BLOCKS = 20
#: Gap per attempt between due time and the next scheduling (covers lateness and run time).
_SLACK_S = 3.0
#: What follows an exhausted chain's last attempt, and how many events that is.
TAIL_NONE, TAIL_PARKED, TAIL_PARKED_REPLAYED, TAIL_FAILED = 0, 1, 2, 3
_TAIL_EVENTS = {TAIL_NONE: 0, TAIL_PARKED: 1, TAIL_PARKED_REPLAYED: 2, TAIL_FAILED: 1}
#: An operator replays parked messages this long after they were parked.
_REPLAY_AFTER_S = 600.0
_MAX_LATENESS_S = 1.5

_TASKS = [
    ("billing.charge_card", "billing"), ("email.send_welcome", "email"), ("images.resize", "media"),
    ("crm.sync_contact", "crm"), ("reports.generate_pdf", "reports"), ("webhooks.deliver", "webhooks"),
    ("search.reindex_document", "search"), ("cleanup.expire_sessions", "maintenance"),
]
_EXCEPTIONS = ["ConnectionError", "TimeoutError", "OperationalError", "HTTPError", "RateLimitExceeded",
               "SoftTimeLimitExceeded", "KeyError", "ValueError"]

#: One example of each kind of broken line, cycled to produce ``malformed``.
_BASE = '"task_id": "t", "task_name": "x", "queue": "q"'
MALFORMED_SAMPLES: tuple[str, ...] = (
    "this is not json",
    '{"event": "scheduled", "task_id": "t", "task_name": "x"',  # truncated write
    '{"event": "succeeded", "task_name": "x", "queue": "q", "attempt": 0, "ts": 1.0}',  # no task_id
    '{"event": "succeeded", ' + _BASE + ', "attempt": "x", "ts": 1.0}',
    '{"event": "succeeded", ' + _BASE + ', "attempt": 0, "ts": "soon"}',
    '{"event": "started", ' + _BASE + ', "attempt": 0, "ts": 1.0}',
    '{"event": "delivered", ' + _BASE + ', "attempt": 0, "ts": 1.0}',  # no delay_s/due_at
    "[1, 2, 3]",
)


@dataclass(frozen=True)
class _TaskProfile:
    name: str
    queue: str
    weight: float
    p_fail: float
    max_retries: int
    delay_exp: float
    exceptions: tuple[str, ...]


def _profiles(tasks: int, rng: random.Random) -> list[_TaskProfile]:
    profiles = []
    for i in range(tasks):
        name, queue = _TASKS[i] if i < len(_TASKS) else (f"jobs.task_{i:02d}", "default")
        excs = tuple(rng.sample(_EXCEPTIONS, 3))
        profiles.append(_TaskProfile(
            name=name, queue=queue, weight=1.0 / (i + 1) ** 0.8,
            # One notoriously flaky integration, so "exhausted" shows up.
            p_fail=0.55 if name == "webhooks.deliver" else rng.uniform(0.03, 0.3),
            max_retries=rng.choice((3, 5)),
            delay_exp=rng.uniform(-1.0, 10.0),  # ~0.5 s .. ~17 min typical countdown
            exceptions=excs))
    return profiles


def _chain_table(tasks: int, seed: int, *, incident: bool = False) -> list[tuple[Any, ...]]:
    """One block of chain structures: ``(j, kind, task, queue, attempts, outcome, tail, delay0, exception, offset)``.

    ``offset``: the chain's first event index in the block. With ``incident``,
    :data:`INCIDENT_TASK` fails most of the time with connection errors.
    """
    rng = random.Random(seed)
    profiles = _profiles(tasks, rng)
    if incident:
        rng = random.Random(seed + 1)  # different chains, same task mix
        names = [p.name for p in profiles]
        target = INCIDENT_TASK if INCIDENT_TASK in names else names[0]
        profiles = [replace(p, p_fail=0.9, exceptions=("ConnectionError", "TimeoutError", p.exceptions[0]))
                    if p.name == target else p for p in profiles]
    weights = [p.weight for p in profiles]
    rows = []
    offset = 0
    for j in range(BLOCK_CHAINS):
        p = rng.choices(profiles, weights)[0]
        failures = 0
        while failures < p.max_retries and rng.random() < p.p_fail:
            failures += 1
        exhausted = failures == p.max_retries and rng.random() < p.p_fail
        delay0 = 2.0 ** rng.gauss(p.delay_exp, 1.5)
        exception = rng.choices(p.exceptions, (0.6, 0.3, 0.1))[0]
        attempts = failures + 1
        outcome, tail = "succeeded", 0
        if exhausted:
            outcome = "exhausted"
            tail = rng.choices((TAIL_PARKED, TAIL_PARKED_REPLAYED, TAIL_FAILED), (0.6, 0.15, 0.25))[0]
        elif attempts == 1:
            u = rng.random()
            if u < 0.01:
                outcome = "failed"
            elif u < 0.015:
                outcome = "cancelled"
        rows.append((j, int(incident), p.name, p.queue, attempts, outcome, tail, delay0, exception, offset))
        # A revoked task is "cancelled" instead of "delivered", with no outcome.
        offset += 3 * attempts + _TAIL_EVENTS[tail] - (outcome == "cancelled")
    return rows


def _block_events(rows: list[tuple[Any, ...]]) -> int:
    last = rows[-1]
    return last[-1] + 3 * last[4] + _TAIL_EVENTS[last[6]] - (last[5] == "cancelled")


_TABLE_SCHEMA = StructType([
    StructField(name, kind(), False) for name, kind in (
        ("j", LongType), ("kind", IntegerType), ("task_name", StringType), ("queue", StringType),
        ("attempts", IntegerType), ("outcome", StringType), ("tail", IntegerType), ("delay0", DoubleType),
        ("exception", StringType), ("offset", LongType))
])


def _uniform(*cols: Column, salt: int) -> Column:
    """Deterministic U[0, 1) from a hash (unlike ``rand()``, whatever the partitioning)."""
    bits = F.xxhash64(*cols, F.lit(salt)).bitwiseAND(F.lit((1 << 53) - 1))
    return bits.cast("double") / F.lit(float(1 << 53))


def _task_id(chain: Column, seed: int) -> Column:
    """UUID4-looking id from two independent 64-bit hashes of the chain id (~122 random bits)."""
    h1 = F.xxhash64(chain, F.lit(seed))
    h2 = F.xxhash64(chain, F.lit(~seed))
    return F.format_string(
        "%08x-%04x-4%03x-%04x-%012x",
        F.shiftrightunsigned(h1, 32),
        F.shiftrightunsigned(h1, 16).bitwiseAND(F.lit(0xFFFF)),
        h1.bitwiseAND(F.lit(0xFFF)),
        F.lit(0x8000) + F.shiftrightunsigned(h2, 50),
        h2.bitwiseAND(F.lit((1 << 48) - 1)),
    )


def _phase(n: int, event: Column, ts: Column, delay_s: Column, due_at: Column, exception: Column) -> Column:
    return F.struct(F.lit(n).alias("phase"), event.alias("event"), ts.alias("ts"), delay_s.alias("delay_s"),
                    due_at.alias("due_at"), exception.alias("exception"))


def _events(spark: SparkSession, n_events: int, *, tasks: int, seed: int, start_ts: float, span_s: float,
            partitions: int, incident: bool) -> DataFrame:
    normal = _chain_table(tasks, seed)
    outage = _chain_table(tasks, seed, incident=True)
    len_n, len_o = _block_events(normal), _block_events(outage)

    # Blocks in time order; an incident replaces the block table for a window of blocks, so
    # every chain's first event index stays a closed-form function of its id.
    estimated_blocks = n_events // len_n
    if incident and estimated_blocks >= INCIDENT_MIN_BLOCKS:
        b1 = int(estimated_blocks * INCIDENT_WINDOW[0])
        b2 = max(b1 + 1, int(estimated_blocks * INCIDENT_WINDOW[1]))
    else:
        b1 = b2 = 0

    def block_start(b: int) -> int:
        return b * len_n + min(max(b - b1, 0), b2 - b1) * (len_o - len_n)

    blocks = 0
    while block_start(blocks + 1) <= n_events:
        blocks += 1
    remainder = n_events - block_start(blocks)
    partial = outage if b1 <= blocks < b2 else normal
    n_chains = blocks * BLOCK_CHAINS + bisect.bisect_left([row[-1] for row in partial], remainder)

    table = spark.createDataFrame(normal + outage, _TABLE_SCHEMA)
    cid = F.col("id")
    block = F.floor(cid / BLOCK_CHAINS)
    chains = (
        spark.range(0, n_chains, numPartitions=partitions)
        .withColumn("j", cid % BLOCK_CHAINS)
        .withColumn("kind", F.when((block >= b1) & (block < b2), 1).otherwise(0))
        .join(F.broadcast(table), ["j", "kind"])
        .select(
            cid.alias("cid"),
            (block * len_n + F.least(F.greatest(block - b1, F.lit(0)), F.lit(b2 - b1)) * (len_o - len_n)
             + F.col("offset")).alias("chain_offset"),
            (F.lit(start_ts) + F.lit(span_s) * (cid + _uniform(cid, salt=seed)) / F.lit(n_chains)).alias("t0"),
            _task_id(cid, seed).alias("task_id"),
            "task_name", "queue", "attempts", "outcome", "tail", "delay0", "exception",
        )
    )

    a = F.col("attempt")
    attempts = chains.select("*", F.explode(F.sequence(F.lit(0), F.col("attempts") - 1)).alias("attempt"))
    delay = F.col("delay0") * F.pow(F.lit(2.0), a)
    start = F.col("t0") + F.col("delay0") * (F.pow(F.lit(2.0), a) - 1) + a * F.lit(_SLACK_S)
    u_early, u_tail, u_run = (_uniform(F.col("cid"), a, salt=seed + k) for k in (1, 2, 3))
    tail_scale = F.lit(0.004) + F.lit(0.006) * F.log2(F.lit(2.0) + delay)
    # Early deliveries are a few ms (clock skew), never before the scheduling itself.
    early = F.least(F.lit(0.001) + F.lit(0.03) * u_tail, F.lit(0.5) * delay)
    lateness = F.when(u_early < 0.01, -early).otherwise(
        F.least(F.lit(_MAX_LATENESS_S), F.lit(0.002) - F.log(F.lit(1.0) - u_tail) * tail_scale))
    timed = attempts.select(
        "cid", "chain_offset", "task_id", "task_name", "queue", a,
        delay.alias("delay_s"),
        start.alias("scheduled_ts"),
        (start + delay).alias("due_at"),
        (start + delay + lateness).alias("delivered_ts"),
        (F.lit(0.02) + F.lit(0.5) * u_run).alias("run_s"),
        F.when(a < F.col("attempts") - 1, F.lit("retried")).otherwise(F.col("outcome")).alias("outcome"),
        F.when(a == F.col("attempts") - 1, F.col("tail")).otherwise(F.lit(TAIL_NONE)).alias("tail"),
        F.col("attempts"),
        "exception",
    )

    null_d = F.lit(None).cast("double")
    null_s = F.lit(None).cast("string")
    delivered, ran = F.col("delivered_ts"), F.col("delivered_ts") + F.col("run_s")
    phase = F.explode(F.array(
        _phase(0, F.lit("scheduled"), F.col("scheduled_ts"), F.col("delay_s"), F.col("due_at"), null_s),
        F.when(F.col("outcome") == "cancelled", _phase(1, F.lit("cancelled"), delivered, null_d, null_d, null_s))
        .otherwise(_phase(1, F.lit("delivered"), delivered, F.col("delay_s"), F.col("due_at"), null_s)),
        F.when(F.col("outcome") != "cancelled", _phase(
            2, F.col("outcome"), ran, null_d, null_d,
            F.when(F.col("outcome").isin("retried", "exhausted", "failed"), F.col("exception")))),
        # The chain's tail (last attempt only): parked or failed for good ...
        F.when(F.col("tail") != TAIL_NONE, _phase(
            3, F.when(F.col("tail") == TAIL_FAILED, F.lit("failed")).otherwise(F.lit("parked")),
            ran + F.lit(0.005), null_d, null_d, F.col("exception"))),
        # ... and, for some parked ones, an operator's replay ten minutes later.
        F.when(F.col("tail") == TAIL_PARKED_REPLAYED, _phase(
            4, F.lit("replayed"), ran + F.lit(_REPLAY_AFTER_S) + F.lit(60.0) * u_run, F.lit(0.0), null_d, null_s)),
    )).alias("p")
    return (
        timed.select("chain_offset", "task_id", "task_name", "queue", "attempt", "tail", phase)
        .where(F.col("p").isNotNull())
        # A chain's events are numbered attempt * 3 + phase (the tail follows the last attempt).
        .where(F.col("chain_offset") + F.col("attempt") * 3 + F.col("p.phase") < n_events)
        .select(
            F.to_json(F.struct(
                F.col("p.event").alias("event"), "task_id", "task_name", "queue", "attempt",
                F.round("p.ts", 6).alias("ts"),
                F.round("p.delay_s", 6).alias("delay_s"),
                F.round("p.due_at", 6).alias("due_at"),
                F.col("p.exception").alias("exception"),
                F.when(F.col("p.event") == "cancelled", F.lit("revoked")).alias("reason"),
            )).alias("value")
        )
    )


def generate(
    out_dir: str | os.PathLike[str], n_events: int, *, tasks: int = 8, seed: int = 0,
    start_ts: float = DEFAULT_START_TS, span_s: float = 6 * 3600.0, malformed: int = 0, incident: bool = True,
    files: int | None = None, spark: SparkSession | None = None, master: str = "local[*]", overwrite: bool = False,
) -> dict[str, int]:
    """Write ``n_events`` synthetic events (JSON Lines) under ``out_dir``.

    Chains start uniformly over ``[start_ts, start_ts + span_s)``. With ``incident`` (and
    ~100k+ events), :data:`INCIDENT_TASK` has an outage for :data:`INCIDENT_WINDOW` of the span.
    Writes ``files`` ``part-*.txt`` files (default: one per ~500k events), plus
    ``malformed-lines.jsonl`` with ``malformed`` lines cycling through :data:`MALFORMED_SAMPLES`.
    ``out_dir`` must not exist unless ``overwrite``. Uses ``spark``, else a session on ``master``.

    Returns ``{"events": n_events, "malformed": malformed, "files": files}``.
    """
    if n_events < 0 or malformed < 0:
        raise ValueError("n_events and malformed must be >= 0")
    if tasks < 1:
        raise ValueError("tasks must be >= 1")
    out = Path(out_dir).resolve()
    files = files or max(1, math.ceil(n_events / 500_000))
    with session_scope(master, spark) as session:
        frame = _events(session, n_events, tasks=tasks, seed=seed, start_ts=start_ts, span_s=span_s,
                        partitions=files, incident=incident)
        frame.write.mode("overwrite" if overwrite else "errorifexists").text(out.as_uri())
    if malformed:
        lines = (MALFORMED_SAMPLES[i % len(MALFORMED_SAMPLES)] for i in range(malformed))
        with open(out / "malformed-lines.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)
    return {"events": n_events, "malformed": malformed, "files": files}
