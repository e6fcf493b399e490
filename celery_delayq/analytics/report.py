"""Self-contained HTML report (inline CSS, PNGs as data URIs, no JS): it opens from disk, offline."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from celery_delayq.analytics.plots import backlog, format_duration

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
table{border-collapse:collapse;background:#fff;font-size:.84rem;width:100%;
border:1px solid #d0d7de}
th,td{padding:.35rem .45rem;border-bottom:1px solid #eaeef2;text-align:right;white-space:nowrap}
th{background:#f0f3f6;position:sticky;top:0;white-space:normal;vertical-align:bottom}
td.l,th.l{text-align:left}
td{font-variant-numeric:tabular-nums}
tr:hover td{background:#f6f8fa}
.scroll{overflow-x:auto}
.note{color:#57606a;font-size:.85rem}
h3{font-size:1.05rem;margin:1.2rem 0 .5rem}
td.bad{color:#cf222e;font-weight:600}
.card.alarm{border-color:#cf222e;background:#fff5f5}
.card.alarm .v{color:#cf222e}
.ok{color:#1a7f37}
@media (max-width:900px){body{padding:1rem}.card{min-width:6.5rem;padding:.5rem .7rem}
.card .v{font-size:1.1rem}table{font-size:.78rem}th,td{padding:.3rem .35rem}
th{white-space:normal;vertical-align:bottom}}
"""

_SUMMARY_COLUMNS = (
    ("scheduled", "scheduled"), ("delivered", "delivered"), ("succeeded", "succeeded"), ("retried", "retried"),
    ("celery_failures", "FAILURE (Celery)"), ("parked", "parked"), ("failed", "failed, not parked"),
    ("exhausted", "exhausted"), ("replayed", "replayed"), ("cancelled", "cancelled"),
    ("lateness_p50_ms", "p50 late (ms)"), ("lateness_p99_ms", "p99 late (ms)"), ("early", "early"),
    ("success_after_retry_rate", "success after retry"),
)
_QUEUE_COLUMNS = tuple(c for c in _SUMMARY_COLUMNS if c[0] != "success_after_retry_rate")
#: Columns drawn in red when not zero: what an on-call engineer looks at first.
_ALARMING = frozenset({"celery_failures", "failed", "parked", "exhausted"})

#: Under "Lateness by requested delay": which bucket a delivery is in (tables.requested_bucket).
_LATENESS_NOTE = (
    '<p class="note">Each delivery is filed by the delay that was asked for. The recorded delay is '
    "measured at the publish, a moment after the countdown was set (<code>countdown=2</code> is "
    "recorded as 1.9998 s), so a delay up to 50 ms (and 5%) short of a bucket's lower bound is "
    "filed in that bucket.</p>"
)
#: Under "Top exceptions": what count is (tables.RUN_FAILURES).
_EXCEPTIONS_NOTE = (
    '<p class="note">count = runs that raised the exception, each once: retried, parked or failed. '
    "exhausted = of these, the runs whose retries ran out (each then parked or failed, and counted "
    "there).</p>"
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


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0, alarm: Sequence[int] = ()) -> str:
    """HTML table; ``left`` leading columns are text, ``alarm`` columns are red unless zero; no rows: one line."""
    if not rows:
        return '<p class="note">None in this window.</p>'
    head = "".join(
        f'<th class="l">{html.escape(label)}</th>' if i < left else f"<th>{html.escape(label)}</th>"
        for i, label in enumerate(headers)
    )

    def cell(i: int, text: str) -> str:
        cls = []
        if i < left:
            cls.append("l")
        if i in alarm and text not in ("0", "—"):
            cls.append("bad")
        attr = f' class="{" ".join(cls)}"' if cls else ""
        return f"<td{attr}>{html.escape(text)}</td>"

    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _row(stats: Mapping[str, Any], columns: Sequence[tuple[str, str]]) -> list[str]:
    return [_fmt(celery_failures(stats) if key == "celery_failures" else stats.get(key),
                 "rate" if key == "success_after_retry_rate" else "") for key, _ in columns]


def _alarm_indexes(columns: Sequence[tuple[str, str]], offset: int = 1) -> list[int]:
    return [i + offset for i, (key, _) in enumerate(columns) if key in _ALARMING]


def celery_failures(stats: Mapping[str, Any]) -> int:
    """Runs Celery marked FAILURE: ``failed`` (nothing handles them) plus ``parked`` (kept to replay)."""
    return int(stats.get("failed") or 0) + int(stats.get("parked") or 0)


def _card_row(items: Sequence[tuple[str, str, bool]]) -> str:
    return '<div class="cards">' + "".join(
        f'<div class="card{" alarm" if bad else ""}"><div class="v">{html.escape(v)}</div>'
        f'<div class="k">{html.escape(k)}</div></div>' for k, v, bad in items) + "</div>"


def _cards(overall: Mapping[str, Any], malformed: int, storms: int, backlog_now: int | None) -> str:
    failures = celery_failures(overall)
    return _card_row([
        *((key, _fmt(overall.get(key)), False) for key in ("scheduled", "delivered", "succeeded", "retried")),
        ("FAILURE (Celery)", _fmt(failures), bool(failures)),
        ("of which parked", _fmt(overall.get("parked")), bool(overall.get("parked"))),
        ("retry storms", _fmt(storms), bool(storms)),
        ("still in the ladder at end", _fmt(backlog_now), False),
        ("p50 lateness", f"{_fmt(overall.get('lateness_p50_ms'))} ms", False),
        ("p99 lateness", f"{_fmt(overall.get('lateness_p99_ms'))} ms", False),
        ("success after retry", _fmt(overall.get("success_after_retry_rate"), "rate"), False),
        ("malformed lines", _fmt(malformed), bool(malformed)),
    ])


def _now(live: Mapping[str, Any] | None) -> list[str]:
    """The first section: what the broker holds now (``delayq status``'s numbers), or why it is not shown."""
    parts = ["<h2>Now, on the broker</h2>"]
    if live is None:
        parts.append('<p class="note">Not read: run it as <code>celery -A APP delayq report</code> '
                     "(the app names the broker) to see what waits, is held or is parked now.</p>")
        return parts
    if "error" in live:
        parts.append(f'<p class="note">The broker ({html.escape(str(live.get("broker", "")))}) did not '
                     f"answer: {html.escape(str(live['error']))}. The history below is from the events.</p>")
        return parts
    totals = live["totals"]
    held = totals.get("held")
    hint = f"celery -A {html.escape(str(live.get('app') or 'APP'))} delayq"
    parts.append(_card_row([
        ("waiting in the ladder", _fmt(totals["waiting"]), False),
        ("held: due, not passed on", "unknown" if held is None else _fmt(held), bool(held)),
        ("parked", _fmt(totals["parked"]), bool(totals["parked"])),
        ("unroutable", _fmt(totals["unroutable"]), bool(totals["unroutable"])),
    ]))
    notes = [f"Read at {html.escape(str(live.get('observed_at')))} from {html.escape(str(live.get('broker')))} "
             f"(ladder <code>{html.escape(str(live['ladder']['prefix']))}</code>)."]
    if live.get("next_due_by"):
        notes.append(f"The next waiting task is due by {html.escape(live['next_due_by'])}, all by "
                     f"{html.escape(live['all_due_by'])} (bounds from the queue TTLs).")
    if not live.get("exists", True):
        notes.append("The ladder does not exist on this broker (nothing waits in it).")
    if held is None:
        notes.append("Held messages need the management API, which did not answer.")
    parts.append(f'<p class="note">{" ".join(notes)}</p>')
    stuck = live.get("held") or {}
    if stuck:
        parts.append(_table(["queue holding overdue messages", "messages"],
                            [[name, _fmt(n)] for name, n in sorted(stuck.items())], left=1, alarm=(1,)))
        parts.append(f'<p class="note">These are due but RabbitMQ keeps them in the dead-letter state: after a '
                     f"broker restart <code>{hint} topology recover</code> moves them; an exit "
                     "queue keeps them until its destination has a binding for their routing key.</p>")
    if totals["parked"]:
        parts.append(f'<p class="note">Parked: <code>{hint} parking list</code>, then '
                     f"<code>{hint} parking replay</code>.</p>")
    return parts


#: Each chart's alt text.
_ALTS = {
    "lateness_over_time.png": "p50 and p99 delivery lateness per minute",
    "backlog_throughput.png": "backlog (scheduled, not yet delivered or cancelled) and events per minute",
    "retries_over_time.png": "retries per minute over time, per task, retry storms shaded",
    "lateness_by_delay.png": "p50 and p99 delivery lateness by requested delay bucket",
    "attempts_to_success.png": "histogram of the attempt on which tasks succeeded",
}


def _figures(images: Mapping[str, bytes], *names: str) -> list[str]:
    """The charts ``names`` that were drawn, inline (a missing one is left out)."""
    return [f'<figure><img src="data:image/png;base64,{base64.b64encode(images[name]).decode("ascii")}" '
            f'alt="{html.escape(_ALTS[name])}" title="{html.escape(name)}"></figure>'
            for name in names if name in images]


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def _attention(summary: Mapping[str, Any]) -> list[str]:
    """The first section: what failed, what got parked, which retries storm."""
    tasks = summary["tasks"]
    hurt = sorted(((name, s) for name, s in tasks.items() if s.get("failed") or s.get("parked")),
                  key=lambda item: (-(item[1].get("failed") or 0) - (item[1].get("parked") or 0), item[0]))
    storms = summary.get("retry_storms", [])
    parts = ["<h2>Needs attention</h2>"]
    if not hurt and not storms:
        parts.append('<p class="ok">No failed or parked tasks and no retry storms in this window.</p>')
        return parts
    if hurt:
        parts.append(_table(
            ["task", "FAILURE (Celery)", "failed, not parked", "parked", "exhausted", "retried", "succeeded"],
            [[name, _fmt(celery_failures(s)), _fmt(s.get("failed")), _fmt(s.get("parked")), _fmt(s.get("exhausted")),
              _fmt(s.get("retried")), _fmt(s.get("succeeded"))] for name, s in hurt],
            left=1, alarm=(1, 2, 3)))
    if storms:
        parts += [
            "<h3>Retry storms</h3>",
            _table(["task", "from (UTC)", "to (UTC)", "peak / min", "normal / min", "retries"],
                   [[s["task_name"], _utc(s["start_s"]), _utc(s["end_s"]), _fmt(s["peak_per_minute"]),
                     _fmt(s["baseline_per_minute"]), _fmt(s["retries"])] for s in storms],
                   left=3),
            '<p class="note">A storm: a task\'s retries per minute reach 4× its normal (the median '
            "of its last 15 calm minutes) and at least 10; the first 15 minutes only learn the "
            "normal.</p>",
        ]
    return parts


def render_html(summary: Mapping[str, Any], tables: Mapping[str, Sequence[Mapping[str, Any]]],
                images: Mapping[str, bytes], *, events_dir: str = "", generated_at: datetime | None = None,
                max_minutes: int = 20) -> str:
    """Render the whole report as one HTML string.

    ``summary``: the ``summary.json`` dict; ``tables``: each table's collected rows; ``images``:
    PNG bytes by file name. Only the busiest ``max_minutes`` retry minutes are tabulated.
    """
    generated = (generated_at or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M:%S UTC")
    overall = summary["overall"]
    timeline = sorted(tables.get("timeline", ()), key=lambda r: r["minute_s"])
    passes = backlog(tables.get("backlog", ()))
    backlog_now = passes[-1][1] if passes else (0 if timeline else None)
    timings = summary.get("timings_s") or {}
    took = (" · took " + ", ".join(f"{html.escape(k)} {v:.1f} s" for k, v in timings.items())) if timings else ""
    span = (f" · events from {_utc(timeline[0]['minute_s'])} to {_utc(timeline[-1]['minute_s'] + 60)} UTC"
            if timeline else "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>celery-delayq telemetry report</title>",
        f"<style>{_CSS}</style></head><body><main>",
        "<h1>celery-delayq telemetry report</h1>",
        f'<div class="meta">events: <code>{html.escape(events_dir)}</code>{span}'
        f" · generated {generated}{took}</div>",
        *_now(summary.get("live")),
        "<h2>In the events of this window</h2>",
        _cards(overall, int(summary.get("malformed", 0)), len(summary.get("retry_storms", [])), backlog_now),
        *_attention(summary),
        "<h2>Over time</h2>",
        *_figures(images, "lateness_over_time.png", "backlog_throughput.png", "retries_over_time.png"),
    ]
    headers = ["task", *(label for _, label in _SUMMARY_COLUMNS)]
    rows = [["all tasks", *_row(overall, _SUMMARY_COLUMNS)]]
    rows += [[name, *_row(stats, _SUMMARY_COLUMNS)] for name, stats in sorted(summary["tasks"].items())]
    parts += [
        "<h2>Per task</h2>",
        _table(headers, rows, left=1, alarm=_alarm_indexes(_SUMMARY_COLUMNS)),
        '<p class="note">Lateness = delivery time − due time over <em>delivered</em> '
        "events; early = delivered before due; FAILURE (Celery) = runs whose Celery state is "
        "FAILURE: parked ones (kept, replayable) plus failed ones (with no retry left and not "
        "parked); success after retry = share of task ids that retried at least once and "
        "later succeeded.</p>",
    ]
    queues = summary.get("queues", {})
    parts += ["<h2>Per queue</h2>",
              _table(["queue", *(label for _, label in _QUEUE_COLUMNS)],
                     [[name, *_row(stats, _QUEUE_COLUMNS)] for name, stats in sorted(queues.items())],
                     left=1, alarm=_alarm_indexes(_QUEUE_COLUMNS))]

    parts += ["<h2>Lateness by requested delay</h2>", *_figures(images, "lateness_by_delay.png")]
    lateness = sorted(tables.get("lateness_by_delay", ()), key=lambda r: r["delay_bucket_s"])
    parts.append(_table(
        ["delay bucket", "delivered", "p50 late (ms)", "p99 late (ms)", "early"],
        [[_fmt(r["delay_bucket_s"], "duration"), _fmt(r["delivered"]), _fmt(r["lateness_p50_ms"]),
          _fmt(r["lateness_p99_ms"]), _fmt(r["early"])] for r in lateness],
        left=1))
    if lateness:
        parts.append(_LATENESS_NOTE)

    exceptions = sorted(tables.get("top_exceptions", ()), key=lambda r: (r["task_name"], r["rank"]))
    parts += ["<h2>Top exceptions</h2>", _table(
        ["task", "exception", "rank", "count", "retried", "exhausted", "parked", "failed"],
        [[r["task_name"], r["exception"], _fmt(r["rank"]), _fmt(r["count"]), _fmt(r["retried"]),
          _fmt(r.get("exhausted")), _fmt(r.get("parked")), _fmt(r.get("failed"))] for r in exceptions],
        left=2, alarm=(6, 7))]
    if exceptions:
        parts.append(_EXCEPTIONS_NOTE)

    parts += ["<h2>Attempts to success</h2>", *_figures(images, "attempts_to_success.png")]
    attempts = sorted(tables.get("attempts_to_success", ()), key=lambda r: (r["task_name"], r["attempt"]))
    parts.append(_table(["task", "attempt", "successes"],
                        [[r["task_name"], _fmt(r["attempt"]), _fmt(r["count"])] for r in attempts], left=1))

    busiest = sorted(tables.get("retries_per_minute", ()),
                     key=lambda r: (-r["retries"], r["minute_s"], r["task_name"]))[:max_minutes]
    parts += [
        f"<h2>Busiest retry minutes (top {max_minutes})</h2>",
        _table(["minute (UTC)", "task", "retries"],
               [[_utc(r["minute_s"]), r["task_name"], _fmt(r["retries"])] for r in busiest], left=2),
        "</main></body></html>",
    ]
    return "\n".join(parts)
