"""The report's aggregate tables, as lazy DataFrames over the valid events.

Built-in aggregates only (no Python UDF per event). Every count comes from one scan, every
lateness percentile from another (:func:`_reduce`); the events are scanned again only for
retry recovery per task id and the backlog.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from celery_delayq.analytics.lateness import HAS_SKETCHES, KEYS, LATENESS, SKETCH, Lateness, lateness_ms, sketch_of, split
from celery_delayq.analytics.schema import EVENT_TYPES
from celery_delayq.telemetry.events import FAILURE_EVENTS

__all__ = ["MIN_DELAY_BUCKET_EXP", "PUBLISH_LAG_S", "PUBLISH_LAG_SHARE", "RUN_FAILURES", "SUMMARY_FIELDS",
           "TABLE_NAMES", "TIMELINE_EVENTS", "TOP_EXCEPTIONS", "build_tables", "delay_bucket", "requested_bucket"]

#: Smallest power-of-two delay bucket (2**-10 s, about 1 ms); smaller positive
#: delays are clamped into it, delays <= 0 get bucket 0.0 ("immediate").
MIN_DELAY_BUCKET_EXP = -10
#: How many exceptions to keep per task in ``top_exceptions``.
TOP_EXCEPTIONS = 10
#: A recorded ``delay_s`` falls a moment short of the one asked for (``countdown=2`` is
#: recorded as 1.9998): one at most this much (s) below a bucket's lower bound is filed in it ...
PUBLISH_LAG_S = 0.05
#: ... and at most this share of itself, so the millisecond buckets keep their own delays.
PUBLISH_LAG_SHARE = 0.05
#: The events that end a run that raised, exactly one per run (``exhausted`` is then parked
#: or failed as well: shown beside the count, not counted again).
RUN_FAILURES: tuple[str, ...] = ("retried", "parked", "failed")

#: The per-scope statistics, in ``summary.json`` order.
SUMMARY_FIELDS: tuple[str, ...] = (*EVENT_TYPES, "lateness_p50_ms", "lateness_p99_ms", "early",
                                   "success_after_retry_rate")

#: Events counted per minute in ``timeline``.
TIMELINE_EVENTS: tuple[str, ...] = ("scheduled", "delivered", "succeeded", "retried", "failed", "parked", "cancelled")

#: Names of the tables :func:`build_tables` returns (also their output dirs).
TABLE_NAMES: tuple[str, ...] = ("task_summary", "queue_summary", "lateness_by_delay", "timeline", "backlog",
                                "retries_per_minute", "top_exceptions", "attempts_to_success")


# Columns are built per call: creating one needs a running JVM.
def _event() -> Column:
    return F.col("event")


def _delivered() -> Column:
    return F.col("event") == "delivered"


def _minute(ts: str = "ts") -> Column:
    """Epoch seconds of the minute (UTC) of ``ts``."""
    return (F.floor(F.col(ts) / 60) * 60).cast("long")


#: Suffix of the ladder's laps queue: a delay longer than the ladder is scheduled into it first.
LAPS_SUFFIX = ".laps"


def delay_bucket(delay_s: Column) -> Column:
    """Power-of-two bucket (lower bound, seconds) of a requested delay.

    ``2 ** floor(log2(delay_s))``, corrected where floating point ``log2`` misses an exact power
    of two; clamped to ``2**MIN_DELAY_BUCKET_EXP``; delays <= 0 get bucket 0.0.
    """
    exp0 = F.floor(F.log2(delay_s))
    exp = (exp0 + F.when(F.pow(F.lit(2.0), exp0 + 1) <= delay_s, 1).otherwise(0)
           - F.when(F.pow(F.lit(2.0), exp0) > delay_s, 1).otherwise(0))
    exp = F.greatest(exp, F.lit(MIN_DELAY_BUCKET_EXP))
    return F.when(delay_s <= 0, F.lit(0.0)).otherwise(F.pow(F.lit(2.0), exp))


def requested_bucket(delay_s: Column) -> Column:
    """The :func:`delay_bucket` of the delay asked for: the recorded one plus ``min(PUBLISH_LAG_S, PUBLISH_LAG_SHARE * delay_s)``."""
    allowance = F.greatest(F.least(F.lit(PUBLISH_LAG_S), F.lit(PUBLISH_LAG_SHARE) * delay_s), F.lit(0.0))
    return delay_bucket(delay_s + allowance)


def _reduce(events: DataFrame, *, sketches: bool = HAS_SKETCHES) -> tuple[DataFrame, Lateness]:
    """Every count the report shows, and the deliveries' lateness, each from one scan of the events.

    ``counts``: ``n`` events per ``task_name``, ``queue``, ``minute_s``, ``event``, ``attempt``
    (of a ``succeeded``), ``early`` and ``exception`` (of a failure), which the tables sum.
    The deliveries become lateness sketches per task, queue, minute and delay bucket where
    pyspark has KLL sketches. Both cached (one scan for both cost more).
    """
    delivered = _delivered()
    early = (delivered & (F.col("ts") < F.col("due_at"))).alias("early")
    # A lap's leg (scheduled into the laps queue) is scheduled again to its real queue: counted there.
    lap_leg = (_event() == "scheduled") & F.col("queue").endswith(LAPS_SUFFIX)
    counts = events.where(~lap_leg).groupBy(
        "task_name", "queue", _minute().alias("minute_s"), "event",
        F.when(_event() == "succeeded", F.col("attempt")).alias("attempt"),
        early,
        F.when(_event().isin(*sorted(FAILURE_EVENTS)), F.col("exception")).alias("exception"),
    ).agg(F.count(F.lit(1)).alias("n")).cache()
    deliveries = events.where(delivered).select(
        "task_name", "queue", _minute().alias("minute_s"),
        requested_bucket(F.col("delay_s")).alias("delay_bucket_s"), early, lateness_ms().alias(LATENESS))
    if not sketches:
        return counts, Lateness.of_deliveries(deliveries)
    reduced = deliveries.groupBy(*KEYS, "early").agg(F.count(F.lit(1)).alias("n"), sketch_of(F.col(LATENESS)).alias(SKETCH))
    return counts, Lateness.of_sketches(reduced.cache())


def _sum_where(condition: Column) -> Column:
    """``n`` summed over the rows of :func:`_reduce` that match (0, not null, if none)."""
    return F.sum(F.when(condition, F.col("n")).otherwise(F.lit(0)))


def _scope_of(gid: Column) -> tuple[Column, Column]:
    """``scope`` and ``name`` of a ``GROUPING SETS ((task_name), (queue), ())`` row (gid bits: task_name 2, queue 1)."""
    scope = F.when(gid == 1, F.lit("task")).when(gid == 2, F.lit("queue")).otherwise(F.lit("overall"))
    name = F.when(gid == 1, F.col("task_name")).when(gid == 2, F.col("queue"))
    return scope.alias("scope"), name.alias("name")


def _scope_summary(counts: DataFrame, source: Lateness) -> DataFrame:
    """Counts and lateness per task, per queue and overall: ``scope``, ``name`` (null overall), the counts,
    ``lateness_p50_ms``, ``lateness_p99_ms`` and ``early``."""
    sets: tuple[list[list[str]], str, str] = ([["task_name"], ["queue"], []], "task_name", "queue")
    totals = counts.groupingSets(*sets).agg(
        F.grouping_id("task_name", "queue").alias("_gid"),
        *(_sum_where(_event() == name).alias(name) for name in EVENT_TYPES),
        _sum_where(F.col("early")).alias("early"),
    ).select(*_scope_of(F.col("_gid")), *EVENT_TYPES, "early")
    lateness = (
        source.frame.groupingSets(*sets)
        .agg(F.grouping_id("task_name", "queue").alias("_gid"), source.quantiles().alias("_pct"))
        .select(*_scope_of(F.col("_gid")), *split(F.col("_pct")))
    )
    return totals.join(
        lateness, on=(totals["scope"] == lateness["scope"]) & totals["name"].eqNullSafe(lateness["name"]), how="left",
    ).select(totals["scope"], totals["name"], *EVENT_TYPES, "lateness_p50_ms", "lateness_p99_ms", "early")


def _recovery(events: DataFrame) -> DataFrame:
    """Per task and overall: task ids that retried, and those that succeeded after it."""
    per_task_id = (
        events.where(_event().isin("retried", "succeeded"))
        # A 64-bit hash shuffles a quarter of a UUID's bytes (a clash in 10M ids: odds ~1 in 400,000).
        .groupBy("task_name", F.xxhash64("task_id").alias("_id"))
        .agg(
            F.min(F.when(_event() == "retried", F.col("ts"))).alias("first_retry"),
            F.max(F.when(_event() == "succeeded", F.col("ts"))).alias("last_success"),
        )
        .where(F.col("first_retry").isNotNull())
    )
    return per_task_id.rollup("task_name").agg(
        F.grouping_id().alias("_gid"),
        F.count(F.lit(1)).alias("_retried_ids"),
        # ">=": a success in the same clock tick as the retry still came after it.
        F.count_if(F.col("last_success") >= F.col("first_retry")).alias("_recovered_ids"),
    )


def _summaries(events: DataFrame, counts: DataFrame, source: Lateness) -> tuple[DataFrame, DataFrame]:
    """``(task_summary, queue_summary)`` (see :func:`build_tables`), from one cached aggregate."""
    scopes = _scope_summary(counts, source).cache()
    recovery = _recovery(events)
    tasks = scopes.where(F.col("scope") != "queue")
    joined = tasks.join(
        recovery, how="left",
        on=(F.when(tasks["scope"] == "overall", 1).otherwise(0) == recovery["_gid"])
        & tasks["name"].eqNullSafe(recovery["task_name"]))
    rate = F.when(recovery["_retried_ids"] > 0, recovery["_recovered_ids"].cast("double") / recovery["_retried_ids"])
    task_summary = joined.select(
        tasks["scope"], tasks["name"].alias("task_name"), *(tasks[name] for name in EVENT_TYPES),
        tasks["lateness_p50_ms"], tasks["lateness_p99_ms"], tasks["early"], rate.alias("success_after_retry_rate"))
    queue_summary = scopes.where(F.col("scope") == "queue").select(
        F.col("name").alias("queue"), *EVENT_TYPES, "lateness_p50_ms", "lateness_p99_ms", "early")
    return task_summary, queue_summary


def _lateness_by_delay(source: Lateness) -> DataFrame:
    return (source.frame.groupBy("delay_bucket_s")
            .agg(source.delivered().alias("delivered"), source.quantiles().alias("_pct"), source.early().alias("early"))
            .select("delay_bucket_s", "delivered", *split(F.col("_pct")), "early"))


def _timeline(counts: DataFrame, source: Lateness) -> DataFrame:
    """Per minute: events of each kind and the lateness of that minute's deliveries."""
    per_minute = counts.groupBy("minute_s").agg(*(_sum_where(_event() == name).alias(name) for name in TIMELINE_EVENTS))
    lateness = source.frame.groupBy("minute_s").agg(source.quantiles().alias("_pct"))
    return per_minute.join(lateness, on="minute_s", how="left").select("minute_s", *TIMELINE_EVENTS, *split(F.col("_pct")))


def _backlog(events: DataFrame) -> DataFrame:
    """Per minute: ladder passes that ``entered`` (were scheduled) and ``left`` (delivered or cancelled).

    A pass is one ``(task_id, attempt)``: it enters at its first ``scheduled`` and leaves at its
    first ``delivered`` or ``cancelled``; a pass not scheduled in the window is not counted, so the
    backlog is never below zero.
    """
    passes = (
        events.where(_event().isin("scheduled", "delivered", "cancelled"))
        .groupBy(F.xxhash64("task_id").alias("_id"), "attempt")
        .agg(
            F.min(F.when(_event() == "scheduled", F.col("ts"))).alias("entered_ts"),
            F.min(F.when(_event() != "scheduled", F.col("ts"))).alias("left_ts"),
        )
        .where(F.col("entered_ts").isNotNull())
    )
    moves = passes.select(F.explode(F.array(
        F.struct(_minute("entered_ts").alias("minute_s"), F.lit(1).alias("entered"), F.lit(0).alias("left")),
        F.when(F.col("left_ts").isNotNull(),
               F.struct(_minute("left_ts").alias("minute_s"), F.lit(0).alias("entered"), F.lit(1).alias("left"))),
    )).alias("m")).where(F.col("m").isNotNull())
    return moves.groupBy(F.col("m.minute_s").alias("minute_s")).agg(
        F.sum("m.entered").cast("long").alias("entered"), F.sum("m.left").cast("long").alias("left")
    )


def _top_exceptions(counts: DataFrame, top_n: int) -> DataFrame:
    """Per task, its exceptions ranked by the runs they failed (``count``: see :data:`RUN_FAILURES`).

    Exceptions that failed no run in the window are left out (an ``exhausted`` whose parking is
    named otherwise, or falls after the window).
    """
    per_exception = (
        counts.where(_event().isin(*sorted(FAILURE_EVENTS)))
        .groupBy("task_name", "exception")
        .agg(
            _sum_where(_event().isin(*RUN_FAILURES)).alias("count"),
            *(_sum_where(_event() == name).alias(name) for name in sorted(FAILURE_EVENTS)),
        )
        .where(F.col("count") > 0)
    )
    # Ties broken by name so the ranking is deterministic.
    ranking = Window.partitionBy("task_name").orderBy(F.desc("count"), F.asc("exception"))
    return (per_exception.withColumn("rank", F.row_number().over(ranking)).where(F.col("rank") <= top_n)
            .select("task_name", "rank", "exception", "count", "retried", "exhausted", "parked", "failed"))


def _sum_n(counts: DataFrame, event: str, keys: tuple[str, str], alias: str) -> DataFrame:
    return counts.where(_event() == event).groupBy(*keys).agg(F.sum("n").alias(alias))


def build_tables(spark: SparkSession, df: DataFrame, *, top_exceptions: int = TOP_EXCEPTIONS,
                 sketches: bool = HAS_SKETCHES) -> dict[str, DataFrame]:
    """Build the report tables from valid events (see :func:`read_events`).

    Returns lazy DataFrames keyed by :data:`TABLE_NAMES`, each reading ``df`` (persist it); docs/report.md
    ("The Parquet tables") lists their columns; ``top_exceptions`` are kept per task. Lateness percentiles
    merge KLL sketches; ``sketches=False`` (default before pyspark 4.1.2) uses ``percentile_approx``.
    ``spark`` is unused (symmetry with :func:`read_events`).
    """
    counts, source = _reduce(df, sketches=sketches)
    task_summary, queue_summary = _summaries(df, counts, source)
    return {
        "task_summary": task_summary,
        "queue_summary": queue_summary,
        "lateness_by_delay": _lateness_by_delay(source),
        "timeline": _timeline(counts, source),
        "backlog": _backlog(df),
        "retries_per_minute": _sum_n(counts, "retried", ("task_name", "minute_s"), "retries"),
        "top_exceptions": _top_exceptions(counts, top_exceptions),
        "attempts_to_success": _sum_n(counts, "succeeded", ("task_name", "attempt"), "count"),
    }
