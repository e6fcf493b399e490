"""PNG charts for the report, from plain rows Spark aggregated.

Figures are :class:`matplotlib.figure.Figure` objects, not ``pyplot``: headless, and the
caller's matplotlib state is never changed.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import matplotlib
from matplotlib import dates as mdates
from matplotlib import ticker
from matplotlib.figure import Figure

__all__ = ["CHARTS", "attempts_to_success_png", "backlog", "backlog_throughput_png", "lateness_over_time_png",
           "format_duration", "lateness_by_delay_png", "minute_span", "render_all", "retries_over_time_png"]

_STYLE = {
    "font.size": 11, "axes.titlesize": 13, "axes.titleweight": "bold", "axes.labelsize": 11,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
    "grid.linestyle": "-", "legend.frameon": False, "legend.fontsize": 9, "figure.facecolor": "white",
}
_SIZE = (8.0, 4.5)
_DPI = 120
#: Tasks beyond this many (by volume) are folded into "other" so legends stay readable.
MAX_SERIES = 7
_PALETTE = matplotlib.colormaps["tab10"].colors


def format_duration(seconds: float) -> str:
    """Short human label for a delay in seconds (``250 ms``, ``8 s``, ``17 min``, ``2.3 h``)."""
    if seconds <= 0:
        return "0"
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 1000:
        return f"{seconds:.3g} s"
    if seconds < 6000:
        return f"{seconds / 60:.2g} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.2g} h"
    return f"{seconds / 86400:.2g} d"


def format_count(n: int) -> str:
    """``n`` in at most four characters and a suffix: ``950``, ``5.8k``, ``16k``, ``1.2M``."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            value = n / size
            return f"{value:.1f}{suffix}" if round(value, 1) < 10 else f"{value:.0f}{suffix}"
    return str(n)


def _figure() -> Figure:
    return Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def _no_data(fig: Figure, title: str) -> bytes:
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=14, color="0.5", transform=ax.transAxes)
    ax.set_axis_off()
    return _png(fig)


def _stacks(points: Iterable[tuple[str, int, int]]) -> list[tuple[str, dict[int, int]]]:
    """``(task, x, n)`` summed per task and ``x`` (a minute, an attempt): the busiest tasks each alone, the
    rest folded into ``"other"`` (``[]`` when there are no points)."""
    series: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    totals: dict[str, int] = defaultdict(int)
    for name, x, n in points:
        series[name][x] += n
        totals[name] += n
    if not totals:
        return []
    ranked = sorted(totals, key=lambda name: (-totals[name], name))
    stacks = [(name, series[name]) for name in ranked[:MAX_SERIES]]
    if len(ranked) > MAX_SERIES:
        other: dict[int, int] = defaultdict(int)
        for name in ranked[MAX_SERIES:]:
            for x, n in series[name].items():
                other[x] += n
        stacks.append(("other", other))
    return stacks


def _lateness_axis(ax: Any, lowest_p50: float) -> str:
    """The y scale of a lateness plot, set on ``ax``: ``"log"`` (1-2-5 ticks in plain numbers, none in
    6×10¹ notation) when every median is late, else ``"symlog"`` with a line at 0 (an early, negative
    median can't go on a log axis)."""
    if lowest_p50 > 0:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        return "log"
    ax.set_yscale("symlog", linthresh=1.0)
    ax.axhline(0, color="0.3", linewidth=0.8)
    return "symlog"


def lateness_by_delay_png(rows: Iterable[Mapping[str, Any]]) -> bytes:
    """p50/p99 delivery lateness per power-of-two delay bucket (rows of ``lateness_by_delay``).

    Log2 x axis; log y axis, or symmetric-log where early (negative) medians occur.
    """
    with matplotlib.rc_context(_STYLE):
        fig = _figure()
        title = "Delivery lateness by requested delay"
        data = sorted((r for r in rows if r.get("lateness_p50_ms") is not None), key=lambda r: r["delay_bucket_s"])
        if not data:
            return _no_data(fig, title)
        positive = [r["delay_bucket_s"] for r in data if r["delay_bucket_s"] > 0]
        # Bucket 0 cannot sit on a log axis: one step left of the smallest, labelled "0".
        zero_x = (min(positive) if positive else 1.0) / 2
        xs = [r["delay_bucket_s"] if r["delay_bucket_s"] > 0 else zero_x for r in data]
        p50 = [r["lateness_p50_ms"] for r in data]
        p99 = [r["lateness_p99_ms"] for r in data]

        ax = fig.add_subplot()
        ax.fill_between(xs, p50, p99, color=_PALETTE[0], alpha=0.12, linewidth=0)
        ax.plot(xs, p99, marker="o", color=_PALETTE[3], label="p99")
        ax.plot(xs, p50, marker="o", color=_PALETTE[0], label="p50")
        ax.set_xscale("log", base=2)
        y_scale = _lateness_axis(ax, min(p50))
        ax.xaxis.set_major_locator(ticker.FixedLocator(xs))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        # How many deliveries each point stands for, along the bottom; staggered where buckets crowd.
        crowded = len(xs) > 8
        for i, (x, r) in enumerate(zip(xs, data, strict=True)):
            ax.annotate(f"n={format_count(int(r.get('delivered') or 0))}", (x, 0),
                        xycoords=("data", "axes fraction"), xytext=(0, 3 + (9 if crowded and i % 2 else 0)),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7, color="0.35")
        ax.margins(y=0.2)
        labels = [format_duration(r["delay_bucket_s"]) for r in data]
        ax.set_xticks(xs, labels, rotation=45 if len(xs) > 8 else 0, ha="right" if len(xs) > 8 else "center")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("requested delay bucket (lower bound, log scale)")
        ax.set_ylabel(f"lateness: delivered − due (ms, {y_scale})")
        ax.set_title(title)
        ax.legend(loc="upper left")
        return _png(fig)


_BIN_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)
_MAX_BINS = 150
#: The narrowest time axis (s), so a one-minute window's ticks read as clock times.
_MIN_SPAN_S = 300


def _time_axis(ax: Any, span: tuple[float, float] | None = None) -> None:
    """UTC clock ticks; with ``span`` (epoch s), exactly that range (widened to :data:`_MIN_SPAN_S`).

    Without explicit limits matplotlib pads a date axis around a single point by years.
    """
    locator = mdates.AutoDateLocator(tz=timezone.utc, minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
    if span is not None:
        start, end = span
        if end - start < _MIN_SPAN_S:
            pad = (_MIN_SPAN_S - (end - start)) / 2
            start, end = start - pad, end + pad
        ax.set_xlim(_utc(start), _utc(end))


def _count_axis(ax: Any, top: float) -> None:
    """Whole-number ticks for counts: no ``0.5 messages``, no ``-0``."""
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True, min_n_ticks=2))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{round(v) + 0:,}"))
    if top <= 0:
        ax.set_ylim(0, 1)


def minute_span(timeline: Iterable[Mapping[str, Any]]) -> tuple[float, float] | None:
    """``(start, end)`` epoch seconds of the minutes the timeline covers (end = last minute's end)."""
    minutes = [int(r["minute_s"]) for r in timeline]
    return (min(minutes), max(minutes) + 60) if minutes else None


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def retries_over_time_png(rows: Iterable[Mapping[str, Any]], storms: Iterable[Mapping[str, Any]] = (),
                          span: tuple[int, int] | None = None) -> bytes:
    """Retries per minute over time, stacked by task (top tasks + "other"), from ``retries_per_minute`` rows.

    Long ranges are averaged into wider bins (at most ~150); ``storms``
    (:func:`~celery_delayq.analytics.storms.find_storms`) are shaded and labelled; ``span``
    (epoch s) lines the x axis up with the other time charts.
    """
    with matplotlib.rc_context(_STYLE):
        fig = _figure()
        stacks = _stacks((r["task_name"], int(r["minute_s"]) // 60, r["retries"]) for r in rows)
        if not stacks:
            return _no_data(fig, "Retries per minute")

        first = min(m for _, points in stacks for m in points)
        last = max(m for _, points in stacks for m in points)
        if span is not None:
            first, last = min(first, int(span[0]) // 60), max(last, (int(span[1]) - 1) // 60)
        width = next((b for b in _BIN_MINUTES if (last - first) / b <= _MAX_BINS), _BIN_MINUTES[-1])
        start = first - first % width
        bins = list(range(start, last + 1, width))  # silent bins stay 0 instead of being interpolated
        # step="post": one more edge, so the last bin has a width.
        edges = [_utc(b * 60) for b in [*bins, bins[-1] + width]]
        ys = []
        for _, points in stacks:
            binned: dict[int, int] = defaultdict(int)
            for minute, n in points.items():
                binned[minute - (minute - start) % width] += n
            values = [binned.get(b, 0) / width for b in bins]
            ys.append([*values, values[-1]])

        ax = fig.add_subplot()
        colors = [_PALETTE[i % len(_PALETTE)] for i in range(len(stacks))]
        ax.stackplot(edges, ys, labels=[name for name, _ in stacks], colors=colors, alpha=0.85, step="post")
        top = max(sum(col) for col in zip(*ys, strict=False))
        for i, storm in enumerate(storms):
            ax.axvspan(_utc(storm["start_s"]), _utc(storm["end_s"]), color="#d1242f", alpha=0.12,
                       linewidth=0, label="retry storm" if i == 0 else None)
            # Staggered, so storms close together don't print over each other.
            ax.annotate(storm["task_name"], (_utc(storm["start_s"]), top * (1.12 - 0.07 * (i % 3))),
                        fontsize=8, color="#d1242f", ha="left", va="top")
        _time_axis(ax, (bins[0] * 60, (bins[-1] + width) * 60))
        ax.set_ylim(0, top * 1.2 if top else 1)
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel("retries / minute")
        suffix = "" if width == 1 else f" ({width}-min average)"
        ax.set_title("Retries per minute" + suffix)
        # Below: names beside it would make it narrower than the other time charts.
        fig.legend(loc="outside lower center", ncols=4, fontsize=8)
        return _png(fig)


def lateness_over_time_png(timeline: Iterable[Mapping[str, Any]]) -> bytes:
    """p50 and p99 delivery lateness per minute (mid-minute points; minutes without deliveries are gaps)."""
    with matplotlib.rc_context(_STYLE):
        fig = _figure()
        title = "Delivery lateness over time (per minute)"
        rows = list(timeline)
        span = minute_span(rows)
        by_minute = {int(r["minute_s"]) // 60: r for r in rows if r.get("lateness_p50_ms") is not None}
        if not by_minute:
            return _no_data(fig, title)
        # Every minute of the range, NaN (a gap) where nothing was delivered.
        minutes = range(min(by_minute), max(by_minute) + 1)
        nan = float("nan")
        xs = [_utc(m * 60 + 30) for m in minutes]
        p50 = [by_minute[m]["lateness_p50_ms"] if m in by_minute else nan for m in minutes]
        p99 = [by_minute[m]["lateness_p99_ms"] if m in by_minute else nan for m in minutes]
        ax = fig.add_subplot()
        marker = "o" if len(xs) <= 30 else None
        ax.plot(xs, p99, color=_PALETTE[3], label="p99", marker=marker, linewidth=1.2)
        ax.plot(xs, p50, color=_PALETTE[0], label="p50", marker=marker, linewidth=1.2)
        scale = _lateness_axis(ax, min(v for v in p50 if v == v))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        _time_axis(ax, span)
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel(f"lateness: delivered − due (ms, {scale})")
        ax.set_title(title)
        fig.legend(loc="outside lower center", ncols=2)
        return _png(fig)


def backlog(rows: Iterable[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``(minute_s, backlog)`` at the end of each minute: what entered the ladder and has not left.

    ``rows``: the ``backlog`` table's (:func:`~celery_delayq.analytics.tables.build_tables`);
    counted from the window's start, never below zero.
    """
    level = 0
    out = []
    for r in sorted(rows, key=lambda r: r["minute_s"]):
        level += int(r.get("entered") or 0) - int(r.get("left") or 0)
        out.append((int(r["minute_s"]), level))
    return out


#: Throughput lines: (timeline column, label, palette index).
_THROUGHPUT = (("scheduled", "scheduled", 7), ("delivered", "delivered", 0), ("succeeded", "succeeded", 2),
               ("retried", "retried", 1), ("failed", "failed", 3), ("parked", "parked", 4))


def backlog_throughput_png(timeline: Iterable[Mapping[str, Any]],
                           passes: Iterable[Mapping[str, Any]] = ()) -> bytes:
    """Two panels over time: the backlog (see :func:`backlog`, from ``passes``) and events per minute."""
    with matplotlib.rc_context(_STYLE):
        rows = sorted(timeline, key=lambda r: r["minute_s"])
        title = "Backlog and throughput"
        if not rows:
            return _no_data(_figure(), title)
        span = minute_span(rows)
        assert span is not None
        fig = Figure(figsize=(_SIZE[0], _SIZE[1] * 1.45), dpi=_DPI, layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 1.3))
        # Every minute of the span, so a quiet minute keeps the level of the one before.
        moves = {int(r["minute_s"]): r for r in passes}
        minutes = range(int(span[0]), int(span[1]), 60)
        levels = backlog([moves.get(m, {"minute_s": m}) for m in minutes])
        # Step "post" over [minute start, next minute start): one more edge at the end.
        edges = [_utc(m) for m, _ in levels] + [_utc(levels[-1][0] + 60)]
        values = [v for _, v in levels]
        top.fill_between(edges, [*values, values[-1]], step="post", color=_PALETTE[0], alpha=0.25, linewidth=0)
        top.step(edges, [*values, values[-1]], where="post", color=_PALETTE[0], linewidth=1.2)
        top.set_ylabel("in the ladder")
        top.set_title("Backlog: scheduled, not yet delivered or cancelled")
        _count_axis(top, max(values))
        top.set_ylim(0, max(1, max(values)) * 1.15)
        peak = 0
        per_minute = {int(r["minute_s"]): r for r in rows}
        drawn = 0
        for name, label, color in _THROUGHPUT:
            ys = [int(per_minute.get(m, {}).get(name) or 0) for m in minutes]
            if not any(ys):
                continue
            peak = max(peak, *ys)
            # Each series thinner than the one under it, so equal lines all show.
            bottom.step(edges, [*ys, ys[-1]], where="post", label=label, color=_PALETTE[color],
                        linewidth=max(1.1, 3.4 - 0.9 * drawn))
            drawn += 1
        if peak > 1000:
            # Bursts and quiet minutes on one chart; small counts stay linear.
            bottom.set_yscale("symlog", linthresh=10)
            bottom.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
            bottom.set_ylabel("events / minute (symlog)")
        else:
            _count_axis(bottom, peak)
            bottom.set_ylim(0, max(1, peak) * 1.15)
            bottom.set_ylabel("events / minute")
        bottom.set_title("Throughput")
        fig.legend(loc="outside lower center", ncols=6, fontsize=8)
        _time_axis(bottom, span)
        bottom.set_xlabel("time (UTC)")
        return _png(fig)


def attempts_to_success_png(rows: Iterable[Mapping[str, Any]]) -> bytes:
    """Histogram of the attempt on which tasks succeeded, stacked by task, each bar labelled with its share."""
    with matplotlib.rc_context(_STYLE):
        fig = _figure()
        title = "Attempt on which tasks succeeded"
        stacks = _stacks((r["task_name"], int(r["attempt"]), r["count"]) for r in rows)
        if not stacks:
            return _no_data(fig, title)

        attempts = list(range(0, max(a for _, c in stacks for a in c) + 1))
        bottom = [0] * len(attempts)
        ax = fig.add_subplot()
        for i, (name, per_attempt) in enumerate(stacks):
            heights = [per_attempt.get(a, 0) for a in attempts]
            ax.bar(attempts, heights, bottom=bottom, label=name, color=_PALETTE[i % len(_PALETTE)], width=0.75)
            bottom = [b + h for b, h in zip(bottom, heights, strict=False)]
        grand = sum(bottom)
        for a, height in zip(attempts, bottom, strict=False):
            if height:
                ax.annotate(f"{height / grand:.1%}" if height / grand >= 0.001 else "<0.1%", (a, height),
                            xytext=(0, 3), textcoords="offset points", ha="center", fontsize=9)
        # Headroom above the tallest bar, so its share label sits under the title.
        ax.set_ylim(0, max(bottom) * 1.15)
        ax.set_xticks(attempts)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.grid(axis="x", visible=False)
        ax.set_xlabel("attempt of the successful run (0 = first run, n = after n retries)")
        ax.set_ylabel("successful tasks")
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return _png(fig)


#: The charts, in report order.
CHARTS: tuple[str, ...] = ("lateness_over_time.png", "backlog_throughput.png", "retries_over_time.png",
                           "lateness_by_delay.png", "attempts_to_success.png")


def render_all(tables: Mapping[str, Sequence[Mapping[str, Any]]],
               storms: Iterable[Mapping[str, Any]] = ()) -> dict[str, bytes]:
    """Render every chart from collected table rows; keys are the PNG file names (:data:`CHARTS`)."""
    return {
        "lateness_over_time.png": lateness_over_time_png(tables["timeline"]),
        "backlog_throughput.png": backlog_throughput_png(tables["timeline"], tables.get("backlog", ())),
        "retries_over_time.png": retries_over_time_png(tables["retries_per_minute"], storms,
                                                       minute_span(tables["timeline"])),
        "lateness_by_delay.png": lateness_by_delay_png(tables["lateness_by_delay"]),
        "attempts_to_success.png": attempts_to_success_png(tables["attempts_to_success"]),
    }
