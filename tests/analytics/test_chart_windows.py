"""Every chart on a 1-minute and a 1-hour window of synthetic telemetry, read back from its matplotlib figure.

A short run once drew lateness as two points on a 2025–2029 axis and a
backlog axis of ``0, 0, 0, -0, -0``; these tests look at what each figure
would show: its time range, its tick labels, the values of its lines.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from matplotlib import dates as mdates

from celery_delayq.analytics import plots, run_report
from benchmarks.synthetic import DEFAULT_START_TS, generate

#: The narrowest time axis a chart draws (a 1-minute window is widened to it, centred).
MIN_SPAN_S = 300


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The figures render_all draws, by chart title (captured instead of only their PNG bytes)."""
    seen: dict[str, Any] = {}
    real_png = plots._png

    def keep(fig: Any) -> bytes:
        fig.canvas.draw()  # tick labels exist only once drawn
        seen[fig.axes[0].get_title()] = fig
        return real_png(fig)

    monkeypatch.setattr(plots, "_png", keep)
    return seen


def _events(spark: Any, tmp_path: Path, span_s: float, n: int) -> Path:
    out = tmp_path / f"events-{int(span_s)}"
    generate(out, n, spark=spark, span_s=span_s, tasks=4, seed=3, incident=False)
    return out


def _x_range(ax: Any) -> tuple[float, float]:
    lo, hi = ax.get_xlim()
    return mdates.num2date(lo).timestamp(), mdates.num2date(hi).timestamp()


def _tick_texts(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_yticklabels() if t.get_text()]


@pytest.mark.parametrize("span_s, n", [(60, 40), (3600, 4000)], ids=["1-minute", "1-hour"])
def test_every_chart_reads_right_on_the_window(spark, tmp_path, figures, span_s: float, n: int) -> None:
    summary = run_report(_events(spark, tmp_path, span_s, n), tmp_path / "out", spark=spark)
    assert summary["overall"]["scheduled"] > 0
    timeline = spark.read.parquet(str(tmp_path / "out" / "timeline")).collect()
    first = min(r.minute_s for r in timeline)
    end = max(r.minute_s for r in timeline) + 60
    wanted = max(end - first, MIN_SPAN_S)

    time_charts = {
        "Delivery lateness over time (per minute)": figures["Delivery lateness over time (per minute)"].axes[0],
        "Backlog": figures["Backlog: scheduled, not yet delivered or cancelled"].axes[1],
        "Retries": next(f for t, f in figures.items() if t.startswith("Retries per minute")).axes[0],
    }
    for name, ax in time_charts.items():
        lo, hi = _x_range(ax)
        # The events' own minutes (a lone minute widened to 5), not years around them.
        assert hi - lo == pytest.approx(wanted, abs=120 * 60 if name == "Retries" else 1), name
        assert lo <= first + 1 and hi >= end - 1, name
        year = datetime.fromtimestamp(first, tz=timezone.utc).year
        assert all(str(year + k) not in " ".join(t.get_text() for t in ax.get_xticklabels())
                   for k in (1, 2, 3)), name

    backlog_fig = figures["Backlog: scheduled, not yet delivered or cancelled"]
    top, bottom = backlog_fig.axes[:2]
    for ax in (top, bottom):
        labels = _tick_texts(ax)
        assert labels and "-0" not in labels and "−0" not in labels
        assert len(set(labels)) == len(labels), labels  # no 0, 0, 0 from rounding fractions
    levels = [v for line in top.get_lines() for v in line.get_ydata()]
    assert min(levels) >= 0  # the backlog of a window is never negative

    lateness = figures["Delivery lateness over time (per minute)"].axes[0]
    delivered_minutes = sum(1 for r in timeline if r.lateness_p50_ms is not None)
    p50 = [line for line in lateness.get_lines() if line.get_label() == "p50"][0]
    assert sum(1 for v in p50.get_ydata() if v == v) == delivered_minutes

    for title in ("Delivery lateness by requested delay", "Attempt on which tasks succeeded"):
        assert title in figures, sorted(figures)


def test_one_minute_of_real_sized_data_has_no_fractional_counts(figures) -> None:
    """40 events in one minute: whole-number ticks on both backlog panels, the minute in the middle."""
    timeline = [{"minute_s": DEFAULT_START_TS, "scheduled": 17, "delivered": 16, "succeeded": 14, "retried": 2,
                 "cancelled": 1, "lateness_p50_ms": 15.0, "lateness_p99_ms": 36.4}]
    plots.backlog_throughput_png(timeline, [{"minute_s": DEFAULT_START_TS, "entered": 17, "left": 17}])
    plots.lateness_over_time_png(timeline)
    top, bottom = figures["Backlog: scheduled, not yet delivered or cancelled"].axes[:2]
    for ax in (top, bottom):
        labels = _tick_texts(ax)
        assert labels[0] == "0" and all(t.isdigit() for t in labels) and len(set(labels)) == len(labels), labels
    lo, hi = _x_range(figures["Delivery lateness over time (per minute)"].axes[0])
    assert (lo, hi) == (pytest.approx(DEFAULT_START_TS + 30 - 150), pytest.approx(DEFAULT_START_TS + 30 + 150))
