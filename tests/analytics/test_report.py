"""The report page from plain rows (no Spark): what a reader sees when a window holds little."""

from __future__ import annotations

import re
from typing import Any

from celery_delayq.analytics.report import render_html

_COUNTS = {"scheduled": 13, "delivered": 13, "succeeded": 13, "retried": 0, "exhausted": 0, "parked": 0,
           "failed": 0, "replayed": 0, "cancelled": 0, "lateness_p50_ms": 25.3, "lateness_p99_ms": 29.0, "early": 0}


def _summary() -> dict[str, Any]:
    return {"overall": {**_COUNTS, "success_after_retry_rate": None},
            "tasks": {"lateness.probe": {**_COUNTS, "success_after_retry_rate": None}},
            "queues": {"delayq-lateness": dict(_COUNTS)}, "retry_storms": [], "malformed": 0,
            "window": {"since": None, "until": None, "files": 1, "incremental": False}, "live": None,
            "timings_s": {"start Spark": 13.0, "parse": 10.9, "aggregate": 32.3}}


def test_a_window_without_exceptions_or_retries_says_so_instead_of_empty_tables() -> None:
    page = render_html(_summary(), {}, {})
    # A header row over nothing read as a broken page (top exceptions, busiest retry minutes, ...).
    assert page.count("None in this window.") >= 2
    for table in re.findall(r"<table>.*?</table>", page, flags=re.S):
        assert "<td" in table, table[:300]
    assert "took start Spark 13.0 s, parse 10.9 s, aggregate 32.3 s" in page


def test_wide_tables_wrap_their_headers_to_fit_the_page() -> None:
    page = render_html(_summary(), {}, {})
    # 14 columns of per-task counts were clipped at 1100 px ("p99 late (m"): headers wrap instead.
    css = re.search(r"th\{[^}]*\}", page)
    assert css is not None and "white-space:normal" in css.group(0), css


def test_lateness_and_exception_tables_say_how_they_count() -> None:
    """Under each table, what its numbers are: the bucket of the requested delay, each failed run once."""
    lateness = [{"delay_bucket_s": 2.0, "delivered": 2, "lateness_p50_ms": 4.0, "lateness_p99_ms": 5.0, "early": 0}]
    exceptions = [{"task_name": "app.a", "rank": 1, "exception": "ConnectionError", "count": 4, "retried": 3,
                   "exhausted": 1, "parked": 1, "failed": 0}]
    page = render_html(_summary(), {"lateness_by_delay": lateness, "top_exceptions": exceptions}, {})
    assert "<code>countdown=2</code> is recorded as 1.9998 s" in page
    assert "count = runs that raised the exception, each once: retried, parked or failed" in page
    bare = render_html(_summary(), {}, {})
    assert "1.9998" not in bare and "count = runs" not in bare  # no note under "None in this window."
