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
