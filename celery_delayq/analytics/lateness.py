"""Lateness percentiles of deliveries (``ts - due_at``), for any grouping, from one scan of the events.

The deliveries are scanned once into a KLL sketch per task, queue, minute and delay bucket, and
every table merges those; before pyspark 4.1.2, ``percentile_approx`` over the deliveries.
Speed and accuracy, measured: docs/report.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = ["ACCURACY", "HAS_SKETCHES", "KEYS", "LATENESS", "QUANTILES", "SKETCH", "SKETCH_K", "Lateness",
           "lateness_ms", "sketch_of", "split"]

#: The quantiles every table shows: p50 and p99.
QUANTILES: tuple[float, float] = (0.5, 0.99)
#: KLL ``k``: rank error about 1/1000, like ``percentile_approx(..., ACCURACY)``.
SKETCH_K = 4_000
#: ``percentile_approx`` accuracy where KLL is missing (rank error 1/accuracy).
ACCURACY = 1_000
#: Whether this pyspark has KLL sketches (and their merge aggregate).
HAS_SKETCHES: bool = hasattr(F, "kll_merge_agg_double") and hasattr(F, "kll_sketch_agg_double")

SKETCH = "_lateness_sketch"
LATENESS = "_lateness_ms"

#: The keys a delivery is grouped by once; any grouping of them can be asked for.
KEYS: tuple[str, ...] = ("task_name", "queue", "minute_s", "delay_bucket_s")


def lateness_ms() -> Column:
    """How late an event came, in ms: ``(ts - due_at) * 1000`` (negative: early)."""
    return (F.col("ts") - F.col("due_at")) * F.lit(1000.0)


def sketch_of(values: Column) -> Column:
    """Aggregate: the KLL sketch of ``values`` (nulls skipped), for :meth:`Lateness.of_sketches`."""
    return F.kll_sketch_agg_double(values, SKETCH_K)


@dataclass(frozen=True)
class Lateness:
    """Deliveries, reduced once, that any grouping's lateness percentiles come from.

    :meth:`of_sketches` or :meth:`of_deliveries` (no KLL); either frame has :data:`KEYS` and ``early``.
    """

    frame: DataFrame
    sketched: bool

    @classmethod
    def of_sketches(cls, frame: DataFrame) -> Lateness:
        """Rows of deliveries grouped by (at least) :data:`KEYS` and ``early``: ``n``
        deliveries and their lateness sketch in :data:`SKETCH` (see :func:`sketch_of`)."""
        return cls(frame, sketched=True)

    @classmethod
    def of_deliveries(cls, deliveries: DataFrame) -> Lateness:
        """One row per delivery: :data:`KEYS`, ``early`` and its lateness in :data:`LATENESS`."""
        return cls(deliveries, sketched=False)

    def quantiles(self) -> Column:
        """Aggregate: ``[p50, p99]`` of the group's lateness in ms (null if it has no delivery)."""
        if self.sketched:
            ranks = F.array(*(F.lit(q) for q in QUANTILES))
            return F.kll_sketch_get_quantile_double(F.kll_merge_agg_double(SKETCH), ranks)
        return F.percentile_approx(LATENESS, list(QUANTILES), ACCURACY)

    def delivered(self) -> Column:
        """Aggregate: deliveries in the group."""
        return F.sum("n") if self.sketched else F.count(F.lit(1))

    def early(self) -> Column:
        """Aggregate: deliveries in the group that came before their due time."""
        if self.sketched:
            return F.sum(F.when(F.col("early"), F.col("n")).otherwise(F.lit(0)))
        return F.count_if(F.col("early"))


def split(quantiles: Column) -> tuple[Column, Column]:
    """``lateness_p50_ms`` and ``lateness_p99_ms`` from a :meth:`Lateness.quantiles` column."""
    return quantiles.getItem(0).alias("lateness_p50_ms"), quantiles.getItem(1).alias("lateness_p99_ms")
