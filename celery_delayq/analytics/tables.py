"""The report's aggregate tables, as lazy DataFrames over the valid events.

Everything here is built from DataFrame operations and built-in aggregates
(``count_if``, KLL sketches, window ``row_number``): no Python UDF ever runs
per event, so the JVM does all the heavy lifting.  Every count comes from
one scan, every lateness percentile from another (:func:`_reduce`: small
cached frames of counts and of quantile sketches that the tables sum and
merge, see :mod:`~celery_delayq.analytics.lateness`).  The events are
scanned again only for what those cannot give: retry recovery per task id.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from celery_delayq.analytics.lateness import (
    HAS_SKETCHES,
    KEYS,
    LATENESS,
    SKETCH,
    Lateness,
    lateness_ms,
    sketch_of,
    split,
)
from celery_delayq.analytics.schema import EVENT_TYPES
from celery_delayq.telemetry.events import FAILURE_EVENTS

__all__ = [
    "MIN_DELAY_BUCKET_EXP",
    "PUBLISH_LAG_S",
    "PUBLISH_LAG_SHARE",
    "RUN_FAILURES",
    "SUMMARY_FIELDS",
    "TABLE_NAMES",
    "TIMELINE_EVENTS",
    "TOP_EXCEPTIONS",
    "build_tables",
    "delay_bucket",
    "requested_bucket",
]

#: Smallest power-of-two delay bucket (2**-10 s, about 1 ms); smaller positive
#: delays are clamped into it, delays <= 0 get bucket 0.0 ("immediate").
MIN_DELAY_BUCKET_EXP = -10
#: How many exceptions to keep per task in ``top_exceptions``.
TOP_EXCEPTIONS = 10
#: A recorded ``delay_s`` is measured when the message is published, a moment after
#: the delay was asked for (Celery turns ``countdown=2`` into an eta, and the publish
#: reads its clock later): ``countdown=2`` is recorded as 1.9998.  A delay at most
#: this much (seconds) below a bucket's lower bound is filed in that bucket ...
PUBLISH_LAG_S = 0.05
#: ... and at most this share of itself, so the millisecond buckets keep their own delays.
PUBLISH_LAG_SHARE = 0.05
#: The events that end a run that raised, exactly one per such run: it is retried,
#: parked, or fails for good.  ``exhausted`` marks the run a retry policy gave up on,
#: which is then parked or failed as well: shown beside the count, not counted again.
RUN_FAILURES: tuple[str, ...] = ("retried", "parked", "failed")

#: The per-scope statistics, in ``summary.json`` order.
SUMMARY_FIELDS: tuple[str, ...] = (
    *EVENT_TYPES,
    "lateness_p50_ms",
    "lateness_p99_ms",
    "early",
    "success_after_retry_rate",
)

#: Events counted per minute in ``timeline``.
TIMELINE_EVENTS: tuple[str, ...] = (
    "scheduled", "delivered", "succeeded", "retried", "failed", "parked", "cancelled",
)

#: Names of the tables :func:`build_tables` returns (also their output dirs).
TABLE_NAMES: tuple[str, ...] = (
    "task_summary",
    "queue_summary",
    "lateness_by_delay",
    "timeline",
    "backlog",
    "retries_per_minute",
    "top_exceptions",
    "attempts_to_success",
)


# Columns are built per call: creating one needs a running JVM, which module
# import time doesn't have.
def _event() -> Column:
    return F.col("event")


def _delivered() -> Column:
    return F.col("event") == "delivered"


def _minute(ts: str = "ts") -> Column:
    """Epoch seconds of the minute (UTC) of ``ts``."""
    return (F.floor(F.col(ts) / 60) * 60).cast("long")


#: Suffix of the ladder's laps queue (``LadderSpec.laps_queue``): a delay longer
#: than the ladder is first scheduled into it, then again to its real queue.
LAPS_SUFFIX = ".laps"


def _lap_leg() -> Column:
    """A ``scheduled`` event into the laps queue: a leg of a long delay, not a destination."""
    return (_event() == "scheduled") & F.col("queue").endswith(LAPS_SUFFIX)


def delay_bucket(delay_s: Column) -> Column:
    """Power-of-two bucket (lower bound, seconds) of a requested delay.

    ``2 ** floor(log2(delay_s))``, corrected by one step where floating point
    ``log2`` lands just below/above an exact power of two (so 8.0 is bucket
    8.0, not 4.0).  Delays below ``2**MIN_DELAY_BUCKET_EXP`` are clamped into
    the smallest bucket; delays <= 0 (run immediately) get bucket 0.0.
    """
    exp0 = F.floor(F.log2(delay_s))
    exp = (
        exp0
        + F.when(F.pow(F.lit(2.0), exp0 + 1) <= delay_s, 1).otherwise(0)
        - F.when(F.pow(F.lit(2.0), exp0) > delay_s, 1).otherwise(0)
    )
    exp = F.greatest(exp, F.lit(MIN_DELAY_BUCKET_EXP))
    return F.when(delay_s <= 0, F.lit(0.0)).otherwise(F.pow(F.lit(2.0), exp))


def requested_bucket(delay_s: Column) -> Column:
    """The :func:`delay_bucket` of the delay that was asked for, from the recorded ``delay_s``.

    The recorded delay falls short of the requested one by the time between
    the request and the publish (``countdown=1`` is recorded as 0.9998), so
    a person's round delay would land one bucket down, under "500 ms".  The
    shortfall is given back before bucketing: ``min(PUBLISH_LAG_S,
    PUBLISH_LAG_SHARE * delay_s)``.  So a delay up to 50 ms (and 5%) below a
    power of two is filed at that power of two; zero and negative delays stay
    in bucket 0.0.
    """
    allowance = F.greatest(
        F.least(F.lit(PUBLISH_LAG_S), F.lit(PUBLISH_LAG_SHARE) * delay_s), F.lit(0.0)
    )
    return delay_bucket(delay_s + allowance)


def _reduce(events: DataFrame, *, sketches: bool = HAS_SKETCHES) -> tuple[DataFrame, Lateness]:
    """Every count the report shows, and the deliveries' lateness, each from one scan of the events.

    ``counts`` has one row per ``task_name``, ``queue``, ``minute_s``,
    ``event``, ``attempt`` (of a ``succeeded`` event; null otherwise),
    ``early`` (a delivery before its due time) and ``exception`` (of a
    failure), with ``n`` events: tens of thousands of rows per day of
    telemetry, so the per-scope, per-minute, retry, exception and attempt
    tables are sums over it instead of scans of the events each.  Where
    pyspark has KLL sketches, the deliveries are reduced the same way, to a
    lateness sketch per task, queue, minute and delay bucket.  Both are
    cached.  (One scan for both cost more: a sketch is allocated
    for every group, deliveries or not.)
    """
    delivered = _delivered()
    early = (delivered & (F.col("ts") < F.col("due_at"))).alias("early")
    # A lap's leg is scheduled again to its real queue: counted once, there.
    counts = events.where(~_lap_leg()).groupBy(
        "task_name",
        "queue",
        _minute().alias("minute_s"),
        "event",
        F.when(_event() == "succeeded", F.col("attempt")).alias("attempt"),
        early,
        # The exception's type name: a handful per task.
        F.when(_event().isin(*sorted(FAILURE_EVENTS)), F.col("exception")).alias("exception"),
    ).agg(F.count(F.lit(1)).alias("n")).cache()
    deliveries = events.where(delivered).select(
        "task_name",
        "queue",
        _minute().alias("minute_s"),
        requested_bucket(F.col("delay_s")).alias("delay_bucket_s"),
        early,
        lateness_ms().alias(LATENESS),
    )
    if not sketches:
        return counts, Lateness.of_deliveries(deliveries)
    reduced = deliveries.groupBy(*KEYS, "early").agg(
        F.count(F.lit(1)).alias("n"), sketch_of(F.col(LATENESS)).alias(SKETCH)
    )
    return counts, Lateness.of_sketches(reduced.cache())


def _sum_where(condition: Column) -> Column:
    """``n`` summed over the rows of :func:`_reduce` that match (0, not null, if none)."""
    return F.sum(F.when(condition, F.col("n")).otherwise(F.lit(0)))


def _scope_of(gid: Column) -> tuple[Column, Column]:
    """``scope`` and ``name`` of a ``GROUPING SETS ((task_name), (queue), ())`` row.

    grouping_id bits: task_name (2), queue (1); a set bit = not grouped by it.
    """
    scope = (
        F.when(gid == 1, F.lit("task")).when(gid == 2, F.lit("queue")).otherwise(F.lit("overall"))
    )
    name = F.when(gid == 1, F.col("task_name")).when(gid == 2, F.col("queue"))
    return scope.alias("scope"), name.alias("name")


def _scope_summary(counts: DataFrame, source: Lateness) -> DataFrame:
    """Counts and lateness per task, per queue and overall.

    Rows: ``scope`` (``task``, ``queue`` or ``overall``), ``name`` (the task
    or queue name; null overall), then the event counts,
    ``lateness_p50_ms``, ``lateness_p99_ms`` and ``early``.  The counts are
    sums over ``counts``, the percentiles merges over ``source``.
    """
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
        lateness,
        on=(totals["scope"] == lateness["scope"]) & totals["name"].eqNullSafe(lateness["name"]),
        how="left",
    ).select(
        totals["scope"], totals["name"], *EVENT_TYPES, "lateness_p50_ms", "lateness_p99_ms", "early"
    )


def _recovery(events: DataFrame) -> DataFrame:
    """Per task and overall: task ids that retried, and those that succeeded after it."""
    # Retry recovery is a per-task-id question; shuffle only the two event
    # kinds that matter, with the columns that matter.
    per_task_id = (
        events.where(_event().isin("retried", "succeeded"))
        # A 64-bit hash shuffles a quarter of the bytes of a UUID string; two of
        # ten million ids share one with odds of about 1 in 400,000.
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
        # ">=": a success stamped in the same clock tick as the retry still
        # came after it (the retry is what scheduled that run).
        F.count_if(F.col("last_success") >= F.col("first_retry")).alias("_recovered_ids"),
    )


def _summaries(
    events: DataFrame, counts: DataFrame, source: Lateness
) -> tuple[DataFrame, DataFrame]:
    """``(task_summary, queue_summary)`` (see :func:`build_tables`)."""
    # Both tables come from this one aggregate: cached (it is a few hundred
    # rows) so that writing the second one doesn't scan the events again.
    scopes = _scope_summary(counts, source).cache()
    recovery = _recovery(events)
    tasks = scopes.where(F.col("scope") != "queue")
    joined = tasks.join(
        recovery,
        on=(F.when(tasks["scope"] == "overall", 1).otherwise(0) == recovery["_gid"])
        & tasks["name"].eqNullSafe(recovery["task_name"]),
        how="left",
    )
    rate = F.when(
        recovery["_retried_ids"] > 0,
        recovery["_recovered_ids"].cast("double") / recovery["_retried_ids"],
    )
    task_summary = joined.select(
        tasks["scope"],
        tasks["name"].alias("task_name"),
        *(tasks[name] for name in EVENT_TYPES),
        tasks["lateness_p50_ms"],
        tasks["lateness_p99_ms"],
        tasks["early"],
        rate.alias("success_after_retry_rate"),
    )
    queue_summary = scopes.where(F.col("scope") == "queue").select(
        F.col("name").alias("queue"),
        *EVENT_TYPES,
        "lateness_p50_ms",
        "lateness_p99_ms",
        "early",
    )
    return task_summary, queue_summary


def _lateness_by_delay(source: Lateness) -> DataFrame:
    return (
        source.frame.groupBy("delay_bucket_s")
        .agg(
            source.delivered().alias("delivered"),
            source.quantiles().alias("_pct"),
            source.early().alias("early"),
        )
        .select("delay_bucket_s", "delivered", *split(F.col("_pct")), "early")
    )


def _timeline(counts: DataFrame, source: Lateness) -> DataFrame:
    """Per minute: events of each kind and the lateness of that minute's deliveries."""
    per_minute = counts.groupBy("minute_s").agg(
        *(_sum_where(_event() == name).alias(name) for name in TIMELINE_EVENTS)
    )
    lateness = source.frame.groupBy("minute_s").agg(source.quantiles().alias("_pct"))
    return per_minute.join(lateness, on="minute_s", how="left").select(
        "minute_s", *TIMELINE_EVENTS, *split(F.col("_pct"))
    )


def _backlog(events: DataFrame) -> DataFrame:
    """Per minute: ladder passes that ``entered`` (were scheduled) and ``left`` (delivered or cancelled).

    A pass is one ``(task_id, attempt)``: it enters at its first ``scheduled``
    event (a long delay's laps leg included) and leaves at its first
    ``delivered`` or ``cancelled`` one, so a revoked task that is both counts
    once, and a delivery with no scheduling in the window (a replay, or a
    message already waiting when the window began) is not a pass of this
    window: the backlog is "scheduled in this window and not out yet", never
    below zero.  One shuffle of the three event kinds by a 64-bit hash of the id.
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
    moves = passes.select(
        F.explode(
            F.array(
                F.struct(_minute("entered_ts").alias("minute_s"), F.lit(1).alias("entered"),
                         F.lit(0).alias("left")),
                F.when(
                    F.col("left_ts").isNotNull(),
                    F.struct(_minute("left_ts").alias("minute_s"), F.lit(0).alias("entered"),
                             F.lit(1).alias("left")),
                ),
            )
        ).alias("m")
    ).where(F.col("m").isNotNull())
    return moves.groupBy(F.col("m.minute_s").alias("minute_s")).agg(
        F.sum("m.entered").cast("long").alias("entered"), F.sum("m.left").cast("long").alias("left")
    )


def _retries_per_minute(counts: DataFrame) -> DataFrame:
    return (
        counts.where(_event() == "retried")
        .groupBy("task_name", "minute_s")
        .agg(F.sum("n").alias("retries"))
    )


def _top_exceptions(counts: DataFrame, top_n: int) -> DataFrame:
    """Per task, its exceptions ranked by the runs they failed (see :data:`RUN_FAILURES`).

    ``count`` is ``retried + parked + failed``: one per run that raised.  A
    run whose retries ran out records ``exhausted`` *and* ``parked`` (or
    ``failed``) for the same failure, so summing every failure event counted
    it twice (a task failing 4 times with ``max_retries=3`` showed 5).
    Exceptions that failed no run in the window are left out: an
    ``exhausted`` whose parking is named otherwise (``self.retry()`` with no
    ``exc`` records ``""`` there and ``MaxRetriesExceededError`` in ``parked``)
    or falls after the window.
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
    return (
        per_exception.withColumn("rank", F.row_number().over(ranking))
        .where(F.col("rank") <= top_n)
        .select("task_name", "rank", "exception", "count", "retried", "exhausted", "parked",
                "failed")
    )


def _attempts_to_success(counts: DataFrame) -> DataFrame:
    return (
        counts.where(_event() == "succeeded")
        .groupBy("task_name", "attempt")
        .agg(F.sum("n").alias("count"))
    )


def build_tables(
    spark: SparkSession,
    df: DataFrame,
    *,
    top_exceptions: int = TOP_EXCEPTIONS,
    sketches: bool = HAS_SKETCHES,
) -> dict[str, DataFrame]:
    """Build the report tables from valid events (see :func:`read_events`).

    Returns lazy DataFrames keyed by :data:`TABLE_NAMES`; nothing runs until
    they are written or collected, and each reads ``df`` (so ``df`` should be
    persisted).  Row order is unspecified.

    * ``task_summary``: ``scope`` (``"task"`` or ``"overall"``), ``task_name``
      (null on the overall row), then :data:`SUMMARY_FIELDS`.
    * ``queue_summary``: ``queue``, the event counts, ``lateness_p50_ms``,
      ``lateness_p99_ms``, ``early``.
    * ``lateness_by_delay``: ``delay_bucket_s`` (the requested delay's, see
      :func:`requested_bucket`),
      ``delivered``, ``lateness_p50_ms``, ``lateness_p99_ms``, ``early``.
    * ``timeline``: ``minute_s`` (epoch seconds, UTC minute start), the
      counts of :data:`TIMELINE_EVENTS` in that minute, and the
      ``lateness_p50_ms``/``lateness_p99_ms`` of its deliveries.
    * ``backlog``: ``minute_s``, ``entered`` and ``left``: ladder passes
      (``(task_id, attempt)``) scheduled, and delivered or cancelled, in that
      minute (see :func:`_backlog`).
    * ``retries_per_minute``: ``task_name``, ``minute_s``, ``retries``.
    * ``top_exceptions``: ``task_name``, ``rank`` (1 = most frequent),
      ``exception``, ``count`` (runs that failed with it, each once: see
      :func:`_top_exceptions`), then ``retried``, ``exhausted``, ``parked``,
      ``failed``; top ``top_exceptions`` per task.
    * ``attempts_to_success``: ``task_name``, ``attempt`` (of the
      ``succeeded`` event, 0 = first run), ``count``.

    Lateness percentiles merge KLL sketches; ``sketches=False`` (the
    default where pyspark is older than 4.1.2) computes them with
    ``percentile_approx`` instead (see :mod:`~celery_delayq.analytics.lateness`).

    ``spark`` is accepted for API symmetry with :func:`read_events` (and
    future session-dependent tables); the tables only depend on ``df``.
    """
    counts, source = _reduce(df, sketches=sketches)
    task_summary, queue_summary = _summaries(df, counts, source)
    return {
        "task_summary": task_summary,
        "queue_summary": queue_summary,
        "lateness_by_delay": _lateness_by_delay(source),
        "timeline": _timeline(counts, source),
        "backlog": _backlog(df),
        "retries_per_minute": _retries_per_minute(counts),
        "top_exceptions": _top_exceptions(counts, top_exceptions),
        "attempts_to_success": _attempts_to_success(counts),
    }
