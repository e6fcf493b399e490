"""Charts and the backlog arithmetic, from plain rows (no Spark)."""

from __future__ import annotations

from celery_delayq.analytics.plots import (
    attempts_to_success_png,
    backlog,
    backlog_throughput_png,
    format_count,
    lateness_over_time_png,
    retries_over_time_png,
)

PNG = b"\x89PNG\r\n\x1a\n"
T0 = 1_704_067_200


def test_backlog_is_what_was_scheduled_and_has_not_left_yet():
    passes = [
        {"minute_s": T0 + 60, "entered": 5, "left": 5},
        {"minute_s": T0, "entered": 10, "left": 2},
        {"minute_s": T0 + 120, "entered": 0, "left": 6},
    ]
    assert backlog(passes) == [(T0, 8), (T0 + 60, 8), (T0 + 120, 2)]


def test_charts_render_edge_cases():
    one_minute = [{"minute_s": T0, "scheduled": 1, "delivered": 1, "lateness_p50_ms": 3.0,
                   "lateness_p99_ms": 9.0}]
    gap = one_minute + [{"minute_s": T0 + 3600, "scheduled": 0, "delivered": 1,
                         "lateness_p50_ms": -2.0, "lateness_p99_ms": 4.0}]
    for png in (
        lateness_over_time_png([]),
        lateness_over_time_png(one_minute),
        lateness_over_time_png(gap),  # negative median: symlog; the hour between is a gap
        backlog_throughput_png([]),
        backlog_throughput_png(gap),
        retries_over_time_png([]),
        retries_over_time_png([{"task_name": "a", "minute_s": T0, "retries": 3}]),
        retries_over_time_png(
            [{"task_name": "a", "minute_s": T0 + 60 * i, "retries": 3 + i} for i in range(30)],
            storms=[{"task_name": "a", "start_s": T0 + 600, "end_s": T0 + 900}],
            span=(T0 - 600, T0 + 3600),
        ),
        attempts_to_success_png([{"task_name": "a", "attempt": 0, "count": 999},
                                 {"task_name": "a", "attempt": 1, "count": 1}]),
    ):
        assert png.startswith(PNG)


def test_bucket_counts_are_short_enough_to_sit_side_by_side():
    # At 10M events the lateness-by-delay chart has 20 buckets; "n=15,801" labels overlapped their neighbours.
    assert [format_count(n) for n in (0, 950, 5_810, 9_999, 15_801, 444_816, 1_234_567, 2_000_000_000)] == [
        "0", "950", "5.8k", "10k", "16k", "445k", "1.2M", "2.0G"]
