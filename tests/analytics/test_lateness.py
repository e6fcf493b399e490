"""Lateness percentiles: sketches merged per grouping agree with exact percentiles."""

from __future__ import annotations

import math
import random

import pytest

from celery_delayq.analytics import lateness
from celery_delayq.analytics.lateness import HAS_SKETCHES, Lateness, split


def _deliveries(spark, lateness_ms: list[float], *, tasks=("a", "b"), minutes=4):
    """Delivered events, late by the given milliseconds, spread over tasks and minutes."""
    rows = []
    for i, late in enumerate(lateness_ms):
        due = 1_700_000_000.0 + 60.0 * (i % minutes)
        task = tasks[i % len(tasks)]
        rows.append(("delivered", task, f"q-{task}", 0, due + late / 1000.0, due, 2.0 ** (i % 5), None))
    return spark.createDataFrame(
        rows, "event string, task_name string, queue string, attempt long, ts double, due_at double, delay_s double, exception string"
    )

def _source(frame, sketches: bool) -> Lateness:
    from celery_delayq.analytics.tables import _reduce

    return _reduce(frame, sketches=sketches)[1]


def _per_task(source: Lateness) -> dict[str, tuple[float, float, int, int]]:
    from pyspark.sql import functions as F

    rows = (
        source.frame.groupBy("task_name")
        .agg(source.quantiles().alias("q"), source.delivered().alias("n"), source.early().alias("e"))
        .select("task_name", *split(F.col("q")), "n", "e")
        .collect()
    )
    return {r.task_name: (r.lateness_p50_ms, r.lateness_p99_ms, r.n, r.e) for r in rows}

def _rank_rule(values: list[float], q: float) -> float:
    """The ceil(q * n)-th smallest value: what both paths promise when exact."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]

PATHS = [pytest.param(False, id="percentile_approx")]
if HAS_SKETCHES:
    PATHS.append(pytest.param(True, id="kll-sketches"))

@pytest.mark.parametrize("sketches", PATHS)
def test_small_groups_are_exact_and_count_early_deliveries(spark, sketches):
    late = [-3.0, 1.0, 2.0, 5.0, 8.0, 13.0, 21.0, 34.0, -1.0, 55.0, 89.0, 144.0]
    got = _per_task(_source(_deliveries(spark, late), sketches))
    for task, own in (("a", late[0::2]), ("b", late[1::2])):
        p50, p99, n, early = got[task]
        assert p50 == pytest.approx(_rank_rule(own, 0.5), abs=0.01)
        assert p99 == pytest.approx(_rank_rule(own, 0.99), abs=0.01)
        assert n == len(own)
        assert early == sum(1 for v in own if v < 0)

@pytest.mark.skipif(not HAS_SKETCHES, reason="this pyspark has no KLL sketches")
def test_merged_sketches_stay_within_a_tenth_of_a_percent_of_the_exact_rank(spark):
    """60,000 deliveries: each sketch compacts (more than k values), the merge still ranks right."""
    rng = random.Random(7)
    late = [rng.lognormvariate(3.0, 1.2) for _ in range(60_000)]
    source = _source(_deliveries(spark, late, tasks=("a",), minutes=1), sketches=True)
    assert source.sketched and lateness.SKETCH_K < 60_000
    p50, p99, n, _ = _per_task(source)["a"]
    ordered = sorted(late)
    for q, value in ((0.5, p50), (0.99, p99)):
        rank = sum(1 for v in ordered if v <= value) / len(ordered)
        assert abs(rank - q) <= 0.001, (q, rank)
    assert n == 60_000

def test_a_group_without_deliveries_has_no_percentiles(spark):
    frame = spark.createDataFrame(
        [("succeeded", "a", "q", 0, 1.0, None, None, None)],
        "event string, task_name string, queue string, attempt long, ts double, due_at double, delay_s double, exception string",
    )
    for sketches in (False, HAS_SKETCHES):
        assert _source(frame, sketches).frame.count() == 0
