"""Targets of issue 5 evaluated on one run's results, and the Markdown report.

Every ratio is computed from numbers measured side by side in the same run;
nothing here is a constant result. A target whose inputs are missing (its
scenario was skipped or failed) is reported as ``n/a``, never as a pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from .peers import TITLES
from .scenarios.throughput import rate_of


@dataclass
class Target:
    """One target: ``measured`` compared with ``required`` (``>=`` unless ``at_most``)."""

    key: str
    text: str
    measured: float | None
    required: float | None
    unit: str = ""
    at_most: bool = False
    detail: str = ""

    @property
    def status(self) -> str:
        if self.measured is None or self.required is None:
            return "n/a"
        ok = self.measured <= self.required if self.at_most else self.measured >= self.required
        return "PASS" if ok else "FAIL"

    @property
    def ratio(self) -> float | None:
        """measured / required (>= 1 passes), inverted for at-most targets."""
        if self.measured is None or self.required in (None, 0):
            return None
        if self.at_most:
            return (self.required / self.measured) if self.measured else float("inf")
        return self.measured / self.required  # type: ignore[operator]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status, "ratio": self.ratio}


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _ceiling(native: float | None, times: float, limit: float | None, what: str) -> str:
    """Say so when a ratio target asks for more than this machine's own limit allows."""
    if not native or not limit or native * times <= limit:
        return ""
    return (f"; unreachable on this machine: {times:g}x native = {_f(native * times)}/s exceeds {what} "
            f"({_f(limit)}/s, {limit / native:.1f}x native)")


def _lat_row(res: dict[str, Any], peer: str, at: str, rate: int, mode: str | None = None) -> dict[str, Any] | None:
    for row in (res.get("lateness") or {}).get("rows", []):
        if row["peer"] == peer and row["at"] == at and row["offered"] == rate and "p99_ms" in row \
                and (mode is None or row["mode"] == mode):
            return row
    return None


def targets(res: dict[str, Any]) -> list[Target]:
    """All targets of the issue, from one run's results."""
    native = rate_of(res, "native", "apply_async")
    send_task = rate_of(res, "baseline", "send_task_unconfirmed")
    raw = rate_of(res, "baseline", "raw_pipelined")
    confirmed = rate_of(res, "baseline", "send_task_confirmed")
    out: list[Target] = []
    each = rate_of(res, "delayq", "apply_async")
    out.append(Target("tp_apply_async_vs_send_task_confirmed",
                      "Scheduling, plain apply_async (confirm each), 1 process: >= 90% of Celery's send_task with "
                      "confirm_publish (Celery's cost plus one confirm)", _div(each, confirmed), 0.90, "",
                      detail=f"{_f(each)}/s vs {_f(confirmed)}/s"))
    for mode, label in (("apply_async", "plain apply_async (confirm each)"),
                        ("apply_async_batch", "apply_async in celery_delayq.batch()")):
        r = rate_of(res, "delayq", mode)
        out.append(Target(f"tp_{mode}_vs_native", f"Scheduling, {label}, 1 process: >= 5x Celery native with confirms",
                          _div(r, native), 5.0, "x",
                          detail=f"{_f(r)}/s vs native {_f(native)}/s" + _ceiling(native, 5.0, send_task,
                                                                                 "Celery's own unconfirmed send_task")))
        out.append(Target(f"tp_{mode}_vs_send_task", f"Scheduling, {label}, 1 process: >= 70% of Celery's unconfirmed send_task",
                          _div(r, send_task), 0.70, "", detail=f"{_f(r)}/s vs send_task {_f(send_task)}/s"))
    for mode, label in (("publish_batch", "LadderPublisher.schedule_body in publisher.batch()"),
                        ("schedule_batch", "LadderPublisher.schedule in publisher.batch()")):
        r = rate_of(res, "delayq", mode)
        out.append(Target(f"tp_{mode}_vs_native", f"Scheduling, kombu level, {label}, 1 process: >= 50x Celery native",
                          _div(r, native), 50.0, "x",
                          detail=f"{_f(r)}/s vs native {_f(native)}/s; {_pct(_div(r, raw))} of the raw pipelined-confirm "
                                 f"limit {_f(raw)}/s" + _ceiling(native, 50.0, raw, "the raw pipelined-confirm limit")))
    index_cost = ((res.get("index_cost") or {}).get("cost") or {})
    for mode, label in (("schedule", "LadderPublisher.schedule (confirm each)"),
                        ("schedule_batch", "LadderPublisher.schedule in batch()")):
        r = index_cost.get(mode) or {}
        out.append(Target(f"index_cost_{mode}", f"Index of waiting tasks, {label}: costs scheduling at most 10%",
                          r.get("ratio"), 0.90, "",
                          detail=f"{_f(r.get('with_index'))}/s with the index vs {_f(r.get('without_index'))}/s "
                                 "without, same run"))
    cs = res.get("confirm_safety") or {}
    rows = cs.get("rows") or []
    out.append(Target("nack_reaches_caller", "Confirms on in every path; a nack reaches the caller as an error",
                      float(sum(1 for r in rows if r["is_publish_error"])) if rows else None,
                      float(len(rows)) if rows else None, "paths",
                      detail=", ".join(f"{r['mode']}: {r['raised'] or 'no error'}" for r in rows)))
    for at, label in (("queue", "at the queue"), ("worker", "through a Celery worker")):
        row = _lat_row(res, "delayq", at, 1000)
        floor = _lat_row(res, "classic", at, 1000, mode="now") if at == "worker" else None
        out.append(Target(f"lateness_p99_{at}", f"p99 lateness at 1,000 delayed msgs/s, {label}: <= 50 ms",
                          row["p99_ms"] if row else None, 50.0, "ms", at_most=True,
                          detail=(f"p50 {row['p50_ms']} ms, max {row['max_ms']} ms, achieved {row['achieved']}/s"
                                  if row else "") + (f"; the same worker with no delay at all: p99 {floor['p99_ms']} ms"
                                                     if row and floor else "")))
        out.append(Target(f"lateness_early_{at}", f"Early deliveries at 1,000 msgs/s, {label}: zero",
                          float(row["early"]) if row else None, 0.0, "", at_most=True,
                          detail=f"of {row['n']}" if row else ""))
    rss = {r["system"]: r for r in (res.get("worker_rss") or {}).get("rows", [])}
    d, c = rss.get("delayq"), rss.get("classic")
    out.append(Target("worker_rss", f"Worker RSS growth with {_f(d['pending']) if d else '?'} pending: <= 5 MB",
                      d["growth_mb"] if d else None, 5.0, "MB", at_most=True,
                      detail=f"classic ETA grew {c['growth_mb']} MB" if c else ""))
    hol = {r["peer"]: r for r in (res.get("hol") or {}).get("rows", [])}
    h = hol.get("delayq")
    out.append(Target("no_hol", "No head-of-line blocking: 1 s message behind a long one arrives at ~1 s",
                      h.get("short_arrived_after_s") if h else None, 1.5, "s", at_most=True,
                      detail=(f"naive TTL queue: {hol['naive'].get('short_arrived_after_s')} s" if "naive" in hol else "")))
    sat = (res.get("broker_cost") or {}).get("saturation") or {}
    dl = ((res.get("limits") or {}).get("dead_letter_quorum") or {}).get("rate")
    hops = sat.get("mean_dead_letterings")
    req = 0.5 * dl / hops if dl and hops else None
    out.append(Target("ladder_throughput", "Sustained ladder throughput: >= 50% of (dead-letter limit / mean hops)",
                      sat.get("delivered_per_s"), req, "msg/s",
                      detail=f"dead-letter limit {_f(dl)}/s (one quorum queue), {hops} hops/message"))
    return out


# -- Markdown ---------------------------------------------------------------------------
def _f(x: Any, nd: int = 0) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def _section(title: str, res: dict[str, Any], key: str, render: Callable[[dict[str, Any]], str]) -> str:
    data = res.get(key)
    if data is None:
        return ""
    if "error" in data and len(data) <= 3:
        return f"\n## {title}\n\nFAILED: `{data['error'][:400]}`\n"
    if data.get("skipped"):
        return f"\n## {title}\n\nSkipped: {data['skipped']}\n"
    return f"\n## {title}\n\n{render(data)}\n"


def _targets_md(ts: list[Target]) -> str:
    rows = []
    for t in ts:
        meas = "n/a" if t.measured is None else (f"{t.measured:.2f}" if t.unit in ("x", "") else f"{t.measured:,.1f}")
        req = "n/a" if t.required is None else (("<= " if t.at_most else ">= ") +
                                                 (f"{t.required:.2f}" if t.unit in ("x", "") else f"{t.required:,.1f}"))
        ratio = "n/a" if t.ratio is None else f"{t.ratio:.2f}"
        rows.append([t.text, f"{meas} {t.unit}".strip(), f"{req} {t.unit}".strip(), ratio, f"**{t.status}**", t.detail])
    return _table(["Target", "Measured", "Required", "Measured/required", "Result", "Detail"], rows)


MODE_LABEL = {
    "raw_pipelined": "raw py-amqp, 500 confirms in flight, one quorum queue",
    "raw_confirm_each": "raw py-amqp, wait for each confirm, one quorum queue",
    "send_task_unconfirmed": "Celery send_task, no delay, no confirms",
    "send_task_confirmed": "Celery send_task, no delay, confirm_publish into a quorum queue",
    "apply_async": "apply_async (confirm each)",
    "apply_async_batch": "apply_async in celery_delayq.batch()",
    "publish_batch": "LadderPublisher.schedule_body in batch()",
    "schedule_batch": "LadderPublisher.schedule in batch()",
    "publish": "kombu publish with expiration (confirm each)",
}


def _throughput_md(data: dict[str, Any]) -> str:
    rows_by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in data["rows"]:
        rows_by.setdefault((r["peer"], r["mode"]), {})[r["procs"]] = r
    res = {"throughput": data}
    native = rate_of(res, "native", "apply_async")
    native8 = rate_of(res, "native", "apply_async", 8)
    send = rate_of(res, "baseline", "send_task_unconfirmed")
    raw = rate_of(res, "baseline", "raw_pipelined")
    rows = []
    for (peer, mode), by in rows_by.items():
        one, eight = by.get(1), by.get(8)
        r1 = one["rate"] if one else None
        r8 = eight["rate"] if eight else None
        rows.append([TITLES.get(peer, peer), MODE_LABEL.get(mode, mode), _f(r1), _f(r8),
                     _f(_div(r1, native), 1) + "x" if r1 else "n/a", _f(_div(r8, native8), 1) + "x" if r8 else "n/a",
                     _pct(_div(r1, send)), _pct(_div(r1, raw))])
    return (f"Durable (persistent) delayed publishes per second, confirmed unless the mode says otherwise; "
            f"delays {data['delay_s'][0]:.0f}-{data['delay_s'][1]:.0f} s, queues purged after each run.\n\n" +
            _table(["System", "Path", "1 process /s", "8 processes /s", "x native (1p)", "x native (8p)",
                    "% of send_task (1p)", "% of raw pipelined (1p)"], rows))


def _limits_md(data: dict[str, Any], res: dict[str, Any]) -> str:
    rows = []
    for key in ("raw_pipelined", "raw_confirm_each", "send_task_unconfirmed", "send_task_confirmed"):
        rows.append([MODE_LABEL[key], _f(rate_of(res, "baseline", key)), _f(rate_of(res, "baseline", key, 8))])
    for qt in ("quorum", "classic"):
        d = data.get(f"dead_letter_{qt}") or {}
        rows.append([f"dead-letter rate of one {qt} TTL queue"
                     + (" (at-least-once)" if qt == "quorum" else " (at-most-once)"), _f(d.get("rate")), ""])
    rl = data.get("raw_ladder_publish") or {}
    rows.append([f"raw py-amqp publish into the default ladder ({rl.get('routing_key_words')}-word routing keys)",
                 _f(rl.get("rate")), ""])
    return _table(["Limit", "1 process /s", "8 processes /s"], rows)


def _confirm_md(data: dict[str, Any]) -> str:
    return ("Every ladder queue capped at max-length 0 by policy (its overflow is reject-publish), "
            "3 publishes per path:\n\n" +
            _table(["Path", "Raised", "PublishError?", "Message"],
                   [[MODE_LABEL.get(r["mode"], r["mode"]), r["raised"] or "nothing",
                     "yes" if r["is_publish_error"] else "**no**", (r["message"] or "")[:90]] for r in data["rows"]]))


#: Lateness rows that are not a peer's delayed delivery.
_LATENESS_LABEL = {("classic", "now"): "Celery, no delay (the worker's own floor)"}


def _lateness_md(data: dict[str, Any]) -> str:
    rows = []
    for r in data["rows"]:
        name = _LATENESS_LABEL.get((r["peer"], r["mode"]), TITLES.get(r["peer"], r["peer"]))
        if r.get("skipped"):
            rows.append([name, r["at"], _f(r["offered"]), "skipped"] + [""] * 11)
            continue
        rows.append([name, r["at"], _f(r["offered"]), _f(r["achieved"]),
                     r["publishers"], _f(r["p50_ms"], 1), _f(r["p99_ms"], 1), _f(r["max_ms"], 1), r["early"],
                     r["missing"], r["duplicates"], _f(r.get("mean_dead_letterings"), 2),
                     _f(r.get("burst_p99")), "yes" if r["sustained"] else "no", _pct(r.get("foreign_cpu"))])
    best = "\n".join(f"- {_LATENESS_LABEL.get(tuple(k.split('@')[0].split(':')), TITLES.get(k.split('@')[0], k))} "
                     f"({k.split('@')[1]}): "
                     f"{_f(v) + ' msgs/s' if v else 'none of the rates tried'}"
                     for k, v in data["highest_sustained"].items())
    return (f"Delays uniform {data['delay_s'][0]:.0f}-{data['delay_s'][1]:.0f} s, {data['duration_s']:.0f} s of "
            f"steady offered load per rate. Lateness = arrival - due (negative = early). Burst p99: the "
            f"arrivals (or, through a worker, task starts) less than 1 ms apart that 99% of messages came in "
            f"with; a worker running tasks one at a time makes the last of a burst wait for the rest. "
            f"Sustained: {data['criterion']}.\n\n" +
            _table(["System", "Measured at", "Offered /s", "Achieved /s", "Publisher procs", "p50 ms", "p99 ms",
                    "max ms", "Early", "Lost", "Dupes", "Dead-letterings/msg (x-death)", "Burst p99",
                    "Sustained", "Other load"], rows) +
            "\n\nHighest sustained rate (of those tried):\n\n" + best)


def _hol_md(data: dict[str, Any]) -> str:
    rows = [[TITLES.get(r["peer"], r["peer"]), r["at"], _f(r.get("short_arrived_after_s"), 3),
             _f(r.get("short_lateness_ms"), 1), _f(r.get("long_arrived_after_s"), 3),
             "**yes**" if r["blocked"] else "no"] for r in data["rows"]]
    return (f"A {data['long_s']:.0f} s message, then immediately a {data['short_s']:.0f} s one"
            + (" (quick mode: 20 s instead of 60 s)" if data["long_s"] < 60 else "") + "."
            + (f" Quick mode ran this next to the {data['concurrent_with']} scenario to save time, so the "
               "millisecond figures carry its load; the seconds are what this measures."
               if data.get("concurrent_with") else "") + "\n\n" +
            _table(["System", "Measured at", "1 s message arrived after (s)", "its lateness (ms)",
                    "long message arrived after (s)", "Blocked"], rows))


def _rss_md(data: dict[str, Any]) -> str:
    rows = [[TITLES.get(r["system"], r["system"]), _f(r["pending"]), r["prefetch_multiplier"], _f(r["rss_before_mb"], 1),
             _f(r["rss_after_mb"], 1), f"{r['growth_mb']:+.1f}", _f(r["held_by_worker_unacked"]),
             _f(r["waiting_in_broker_ladder"])] for r in data["rows"]]
    note = f"\n\n{data['note']}" if data.get("note") else ""
    return _table(["System", "Pending", "Prefetch multiplier", "RSS before (MB)", "RSS after (MB)", "Growth (MB)",
                   "Held by worker (unacked)", "Waiting in broker ladder"], rows) + note


def _broker_md(data: dict[str, Any], res: dict[str, Any]) -> str:
    measured: dict[str, float] = {}
    for r in (res.get("lateness") or {}).get("rows", []):
        if r.get("at") == "queue" and r.get("mean_dead_letterings") is not None:
            measured.setdefault(r["peer"], r["mean_dead_letterings"])
    rows = [[TITLES.get(p, p), _f(v, 2), _f(measured.get(p), 2) if p in measured else ("0" if p == "classic" else "n/a")]
            for p, v in data["analytic_hops"].items()]
    s = data["saturation"]
    sat_rows = [[k, _f(v, 1) if isinstance(v, float) else _f(v)] for k, v in (
        ("messages in the burst", s.get("published")),
        ("due window (s after start)", f"{s['due_window_s'][0]:.0f}-{s['due_window_s'][1]:.0f}"),
        ("publish rate (kombu batch, 2 procs) /s", s.get("publish_rate")),
        ("peak messages in the ladder", s.get("peak_in_ladder")),
        ("delivered /s (10th-90th percentile of arrivals)", s.get("delivered_per_s")),
        ("offered expiry rate /s", s.get("offered_expiry_per_s")),
        ("saturated (delivered < 80% of offered)", s.get("saturated")),
        ("dead-letterings per message (x-death)", s.get("mean_dead_letterings")),
        ("x-delayq-hops header mean", s.get("mean_hops_header")),
        ("dead-letter operations /s", s.get("dead_letters_per_s")),
        ("lost / duplicates", f"{s.get('published', 0) - s.get('received', 0)} / {s.get('duplicates')}"),
    )]
    return (f"Queue hops (dead-letterings) per delayed message, delays uniform "
            f"{data['analytic_delay_s'][0]:.0f}-{data['analytic_delay_s'][1]:.0f} s:\n\n" +
            _table(["System", "Analytic", "Measured (x-death, lateness runs)"], rows) +
            "\n\nThe default ladder at saturation:\n\n" + _table(["", "Value"], sat_rows))


def _tradeoffs_md(data: dict[str, Any], res: dict[str, Any]) -> str:
    dl = ((res.get("limits") or {}).get("dead_letter_quorum") or {}).get("rate")
    rows = []
    for r in data["rows"]:
        v = r["variant"]
        label = v["label"] + (" (default)" if r.get("default") else "")
        if r.get("skipped"):
            rows.append([label, v["queues"], v["max_delay_days"]] + ["skipped"] + [""] * 7)
            continue
        s = r.get("saturation") or {}
        lat = r.get("lateness_1000") or {}
        hops = s.get("mean_dead_letterings")
        need = 0.5 * dl / hops if dl and hops else None
        rows.append([label, v["queues"], v["max_delay_days"], _f((r.get("raw_ladder_publish") or {}).get("rate")),
                     _f(hops, 2), _f(s.get("delivered_per_s")), _f(s.get("dead_letters_per_s")),
                     _f(_div(s.get("delivered_per_s"), need), 2) if need else "n/a",
                     _f(lat.get("p50_ms"), 1) if lat else "-", _f(lat.get("p99_ms"), 1) if lat else "-",
                     lat.get("early", "-") if lat else "-"])
    b = data["saturation_burst"]
    return (f"Saturation burst: {b['n']:,} messages due {b['due_window_s'][0]:.0f}-{b['due_window_s'][1]:.0f} s "
            f"after publishing starts (the same for every variant). Lateness at {data['lateness_rate']:,} msgs/s "
            f"at the queue, delays as in the lateness table ('-' = not measured in this mode).\n\n" +
            _table(["Ladder", "Queues", "Max delay (days)", "Raw publish ceiling /s", "Dead-letterings/msg",
                    "Delivered /s at saturation", "Dead-letters /s", "vs target (>= 1 passes)", "p50 ms @1000/s",
                    "p99 ms @1000/s", "Early @1000/s"], rows))


def _profile_md(data: dict[str, Any]) -> str:
    b = data["baseline"]
    wrows = [["as shipped", _f(b["apply_async"]), _f(b["apply_async_batch"]), _f(b["send_task_unconfirmed"]), "1.00", "1.00"]]
    for w in data["whatifs"]:
        wrows.append([w["change"], _f(w["apply_async"]), _f(w["apply_async_batch"]), _f(w["send_task_unconfirmed"]),
                      f"{w['plain_speedup']:.2f}", f"{w['batch_speedup']:.2f}"])
    p = data["profiles"]["apply_async_batch"]
    prow = [[x["function"], _f(x["calls"]), _f(x["cum_us_per_call"], 1), _pct(x["share_of_total"])] for x in p["path"]]
    note = "" if data["whatifs"] else " (the what-if changes are measured in full mode only)"
    return ("Unprofiled rates in one process, with each proposed core change monkeypatched in "
            f"(cumulative, this benchmark process only){note}:\n\n" +
            _table(["Variant", "apply_async /s", "apply_async in batch() /s", "send_task unconfirmed /s",
                    "plain speed-up", "batch speed-up"], wrows) +
            f"\n\ncProfile of {p['calls']:,} apply_async calls inside batch() (profiler overhead included; "
            "cumulative time per call of the functions on the publish path):\n\n" +
            _table(["Function", "Calls", "Cumulative us/call", "Share of total"], prow))


def _capacity_md(data: dict[str, Any]) -> str:
    m = data["broker_memory_mb"]
    rows = [["published", _f(data["published"])], ["publish time (s)", _f(data["publish_s"], 1)],
            ["publish rate /s", _f(data["publish_rate"])], ["peak in ladder", _f(data["peak_in_ladder"])],
            ["broker memory before / all pending / peak / after (MB)",
             f"{_f(m['before'])} / {_f(m['all_pending'])} / {_f(m['peak'])} / {_f(m['after_delete'])}"],
            ["broker bytes per pending message", _f(data["bytes_per_pending_message"])],
            ["received / lost / duplicates", f"{_f(data['received'])} / {_f(data['lost'])} / {_f(data['duplicates'])}"],
            ["time from first due to last delivered (s)", _f(data["delivery_s_after_first_due"], 1)],
            ["delivery rate /s", _f(data["delivered_per_s"])],
            ["lateness p50 / p99 / max (ms)", "{} / {} / {}".format(*(_f((data.get('lateness') or {}).get(k), 0)
                                                                      for k in ('p50_ms', 'p99_ms', 'max_ms')))]]
    return _table(["", "Value"], rows)


def _index_md(d: dict[str, Any]) -> str:
    from benchmarks.scenarios.index_cost import markdown as index_markdown

    return index_markdown(d)


def markdown(doc: dict[str, Any]) -> str:
    """The whole report."""
    res = doc["results"]
    ts = [Target(**{k: v for k, v in t.items() if k not in ("status", "ratio")}) for t in doc["targets"]]
    m = doc["machine"]
    head = [
        "# celery_delayq benchmarks",
        "",
        f"Command: `{doc['command']}`  ",
        f"Mode: **{doc['mode']}**, started {doc['started']}, took {doc['duration_s']:.0f} s.  ",
        f"Machine: {m.get('cpu_model')}, {m.get('cpu_count')} CPUs, {m.get('memory_gb')} GB RAM, {m.get('os')}; "
        f"RabbitMQ {m.get('rabbitmq')} (fd soft limit {m.get('broker_fd_soft_limit')}); Python {m.get('python')}, "
        f"celery {m.get('celery')}, kombu {m.get('kombu')}, amqp {m.get('amqp')}, celery_delayq {m.get('celery_delayq')}.",
        "",
        f"Code: commit {(m.get('git') or {}).get('commit', '?')}"
        + (f" with uncommitted changes in {', '.join((m.get('git') or {}).get('core_uncommitted') or [])}"
           if (m.get('git') or {}).get('core_uncommitted') else "")
        + f". Load average at start {m.get('load_average_at_start', '?')}; other vhosts on the broker: "
        f"{', '.join(m.get('other_vhosts_on_broker') or []) or 'none'}.",
        "",
        "All numbers below were measured in this run, side by side, on this machine; the broker, the publishers "
        "and the consumers share its CPUs.",
        "",
        "## Targets",
        "",
        _targets_md(ts),
    ]
    if doc.get("errors"):
        head += ["", "Scenario errors: " + "; ".join(f"{k}: {v.splitlines()[-1][:200]}" for k, v in doc["errors"].items())]
    body = [
        _section("1. Scheduling throughput", res, "throughput", _throughput_md),
        _section("7. Machine limits", res, "limits", lambda d: _limits_md(d, res)),
        _section("Confirms and nacks", res, "confirm_safety", _confirm_md),
        _section("2. Delivery lateness", res, "lateness", _lateness_md),
        _section("4. Head-of-line blocking", res, "hol", _hol_md),
        _section("3. Worker RSS with pending delayed tasks", res, "worker_rss", _rss_md),
        _section("5. Broker cost", res, "broker_cost", lambda d: _broker_md(d, res)),
        _section("Design trade-offs (radix, unit, queue type)", res, "tradeoffs", lambda d: _tradeoffs_md(d, res)),
        _section("Where apply_async spends its time", res, "profile", _profile_md),
        _section("Index of waiting tasks (issue 11)", res, "index_cost", _index_md),
        _section("6. Capacity", res, "capacity", _capacity_md),
    ]
    foreign = doc.get("scenario_foreign_cpu", {})
    timing = _table(["Scenario", "Seconds", "CPU used by other processes on the machine meanwhile"],
                    [[k, f"{v:.0f}", _pct(foreign.get(k))] for k, v in doc.get("scenario_seconds", {}).items()])
    return "\n".join(head) + "\n" + "".join(body) + "\n## Scenario durations\n\n" + timing + "\n"
