"""Self-contained HTML report: inline CSS, PNGs as base64 data URIs, no JS.

The file must open from disk (or as a CI artifact / e-mail attachment)
without network access, so nothing is referenced externally.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from celery_delayq.analytics.plots import format_duration

__all__ = ["render_html"]

_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
margin:0;padding:2rem;color:#1f2328;background:#f6f8fa;line-height:1.45}
main{max-width:1100px;margin:0 auto}
h1{margin:0 0 .25rem;font-size:1.7rem}
h2{margin:2rem 0 .75rem;font-size:1.25rem;border-bottom:1px solid #d0d7de;padding-bottom:.3rem}
.meta{color:#57606a;font-size:.9rem}
.cards{display:flex;flex-wrap:wrap;gap:.75rem;margin-top:1rem}
.card{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:.6rem 1rem;
min-width:8.5rem}
.card .v{font-size:1.35rem;font-weight:600;font-variant-numeric:tabular-nums}
.card .k{color:#57606a;font-size:.8rem;text-transform:uppercase;letter-spacing:.03em}
figure{background:#fff;border:1px solid #d0d7de;border-radius:8px;margin:0 0 1rem;padding:.75rem}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
table{border-collapse:collapse;background:#fff;font-size:.88rem;width:100%;
border:1px solid #d0d7de}
th,td{padding:.35rem .6rem;border-bottom:1px solid #eaeef2;text-align:right;white-space:nowrap}
th{background:#f0f3f6;position:sticky;top:0}
td.l,th.l{text-align:left}
td{font-variant-numeric:tabular-nums}
tr:hover td{background:#f6f8fa}
.scroll{overflow-x:auto}
.note{color:#57606a;font-size:.85rem}
"""

_SUMMARY_COLUMNS = (
    ("scheduled", "scheduled"),
    ("delivered", "delivered"),
    ("succeeded", "succeeded"),
    ("retried", "retried"),
    ("exhausted", "exhausted"),
    ("lateness_p50_ms", "p50 late (ms)"),
    ("lateness_p99_ms", "p99 late (ms)"),
    ("early", "early"),
    ("success_after_retry_rate", "success after retry"),
)


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "—"
    if kind == "rate":
        return f"{value:.1%}"
    if kind == "duration":
        return format_duration(value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.3g}"
    return str(value)


def _table(headers: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]], left: int = 0) -> str:
    """HTML table; ``left`` leading columns are text (left-aligned)."""
    head = "".join(
        f'<th class="l">{html.escape(label)}</th>' if i < left else f"<th>{html.escape(label)}</th>"
        for i, (_, label) in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="l">{html.escape(cell)}</td>'
            if i < left
            else f"<td>{html.escape(cell)}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _summary_row(stats: Mapping[str, Any]) -> list[str]:
    return [
        _fmt(stats.get(key), "rate" if key == "success_after_retry_rate" else "")
        for key, _ in _SUMMARY_COLUMNS
    ]


def _cards(overall: Mapping[str, Any], malformed: int) -> str:
    items = [
        ("scheduled", _fmt(overall.get("scheduled"))),
        ("delivered", _fmt(overall.get("delivered"))),
        ("succeeded", _fmt(overall.get("succeeded"))),
        ("retried", _fmt(overall.get("retried"))),
        ("exhausted", _fmt(overall.get("exhausted"))),
        ("p50 lateness", f"{_fmt(overall.get('lateness_p50_ms'))} ms"),
        ("p99 lateness", f"{_fmt(overall.get('lateness_p99_ms'))} ms"),
        ("success after retry", _fmt(overall.get("success_after_retry_rate"), "rate")),
        ("malformed lines", _fmt(malformed)),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="v">{html.escape(v)}</div>'
            f'<div class="k">{html.escape(k)}</div></div>'
            for k, v in items
        )
        + "</div>"
    )


def _img(name: str, png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" '
        f'title="{html.escape(name)}"></figure>'
    )


def render_html(
    summary: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    images: Mapping[str, bytes],
    *,
    events_dir: str = "",
    generated_at: datetime | None = None,
    max_minutes: int = 20,
) -> str:
    """Render the whole report as one HTML string.

    ``summary`` is the ``summary.json`` dict, ``tables`` the collected rows of
    each table (``retries_per_minute`` rows carry ``minute_s``), ``images``
    the PNG bytes keyed by file name.  Only the busiest ``max_minutes``
    retry minutes are tabulated; the chart shows all of them.
    """
    generated = (generated_at or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M:%S UTC")
    overall = summary["overall"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>celery-delayq telemetry report</title>",
        f"<style>{_CSS}</style></head><body><main>",
        "<h1>celery-delayq telemetry report</h1>",
        f'<div class="meta">events: <code>{html.escape(events_dir)}</code>'
        f" · generated {generated}</div>",
        _cards(overall, int(summary.get("malformed", 0))),
        "<h2>Charts</h2>",
    ]
    alts = {
        "lateness_by_delay.png": "p50 and p99 delivery lateness by requested delay bucket",
        "retries_over_time.png": "retries per minute over time, per task",
        "attempts_to_success.png": "histogram of the attempt on which tasks succeeded",
    }
    parts += [_img(name, png, alts.get(name, name)) for name, png in images.items()]

    headers = [("task", "task"), *_SUMMARY_COLUMNS]
    rows = [["all tasks", *_summary_row(overall)]]
    rows += [[name, *_summary_row(stats)] for name, stats in sorted(summary["tasks"].items())]
    parts += [
        "<h2>Per-task summary</h2>",
        _table(headers, rows, left=1),
        '<p class="note">Lateness = delivery time − due time over <em>delivered</em> '
        "events; early = delivered before due; success after retry = share of task "
        "ids that retried at least once and later succeeded.</p>",
    ]

    lateness = sorted(tables.get("lateness_by_delay", ()), key=lambda r: r["delay_bucket_s"])
    parts += [
        "<h2>Lateness by requested delay</h2>",
        _table(
            [
                ("b", "delay bucket"),
                ("d", "delivered"),
                ("p50", "p50 late (ms)"),
                ("p99", "p99 late (ms)"),
                ("e", "early"),
            ],
            [
                [
                    _fmt(r["delay_bucket_s"], "duration"),
                    _fmt(r["delivered"]),
                    _fmt(r["lateness_p50_ms"]),
                    _fmt(r["lateness_p99_ms"]),
                    _fmt(r["early"]),
                ]
                for r in lateness
            ],
            left=1,
        ),
    ]

    exceptions = sorted(tables.get("top_exceptions", ()), key=lambda r: (r["task_name"], r["rank"]))
    parts += [
        "<h2>Top exceptions</h2>",
        _table(
            [
                ("t", "task"),
                ("x", "exception"),
                ("r", "rank"),
                ("c", "count"),
                ("rt", "retried"),
                ("ex", "exhausted"),
            ],
            [
                [
                    r["task_name"],
                    r["exception"],
                    _fmt(r["rank"]),
                    _fmt(r["count"]),
                    _fmt(r["retried"]),
                    _fmt(r["exhausted"]),
                ]
                for r in exceptions
            ],
            left=2,
        ),
    ]

    attempts = sorted(
        tables.get("attempts_to_success", ()), key=lambda r: (r["task_name"], r["attempt"])
    )
    parts += [
        "<h2>Attempts to success</h2>",
        _table(
            [("t", "task"), ("a", "attempt"), ("c", "successes")],
            [[r["task_name"], _fmt(r["attempt"]), _fmt(r["count"])] for r in attempts],
            left=1,
        ),
    ]

    busiest = sorted(
        tables.get("retries_per_minute", ()),
        key=lambda r: (-r["retries"], r["minute_s"], r["task_name"]),
    )[:max_minutes]
    parts += [
        f"<h2>Busiest retry minutes (top {max_minutes})</h2>",
        _table(
            [("m", "minute (UTC)"), ("t", "task"), ("r", "retries")],
            [
                [
                    datetime.fromtimestamp(r["minute_s"], tz=timezone.utc).strftime(
                        "%Y-%m-%d %H:%M"
                    ),
                    r["task_name"],
                    _fmt(r["retries"]),
                ]
                for r in busiest
            ],
            left=2,
        ),
        "</main></body></html>",
    ]
    return "\n".join(parts)
