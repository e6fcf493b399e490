"""Copy the benchmark results into docs/benchmarks.md (BENCHMARKS markers) and the README's headline table (GLANCE markers).

    python benchmarks/readme.py

docs/benchmarks.md shows the quick run's header, targets and main tables from
``benchmarks/results/latest.md``, and, when ``benchmarks/results/full/latest.md``
exists, the full-size scenarios (worker RSS with 100,000 pending, 1,000,000
pending) from that run. Nothing is typed in by hand: rerun the benchmark, then
this script.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- BENCHMARKS:START -->", "<!-- BENCHMARKS:END -->"
#: Sections of the quick run shown in the README, in this order.
QUICK_SECTIONS = ("Targets", "1. Scheduling throughput", "2. Delivery lateness", "3. Worker RSS with pending delayed tasks",
                  "4. Head-of-line blocking", "Design trade-offs (radix, unit, queue type)")
FULL_SECTIONS = ("3. Worker RSS with pending delayed tasks", "6. Capacity")
INTRO = ("Reproduce with `./dev bench --quick` (about 5 minutes; CI runs it too) or `./dev bench --full`. Every "
         "system is measured in the same run, on the same broker and machine, and compared as ratios. The full "
         "output is in `benchmarks/results/latest.md`, with the raw numbers in `latest.json`.")


def split_sections(markdown: str) -> tuple[str, dict[str, str]]:
    """``(text before the first section, {section title: body})`` of a results file."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    head, rest = parts[0], parts[1:]
    return head, {rest[i].strip(): rest[i + 1].strip() for i in range(0, len(rest), 2)}


def header_lines(head: str) -> str:
    """The run's command, mode, machine and code lines (without the file's title)."""
    return "\n".join(line for line in head.strip().splitlines() if not line.startswith("# ")).strip()


def block(quick_md: str, full_md: str | None) -> str:
    """The README block for a quick run's results and, optionally, a full run's."""
    head, sections = split_sections(quick_md)
    out = [INTRO, "", header_lines(head)]
    for title in QUICK_SECTIONS:
        if title in sections:
            out += ["", f"### {title}", "", sections[title]]
    if full_md:
        fhead, fsections = split_sections(full_md)
        out += ["", "### Full size: 100,000 and 1,000,000 pending", "", header_lines(fhead)]
        for title in FULL_SECTIONS:
            if title in fsections:
                out += ["", f"#### {title}", "", fsections[title]]
    return "\n".join(out).strip()


GLANCE_START, GLANCE_END = "<!-- GLANCE:START -->", "<!-- GLANCE:END -->"
#: The targets shown on the README's first screen: (target key, what it shows, what it is compared with).
GLANCE = (
    ("worker_rss", "Worker memory with 20,000 tasks waiting", "MB"),
    ("no_hol", "A 1 s task published right after a 20 s one arrives after", "s"),
    ("lateness_p99_worker", "p99 lateness at 1,000 delayed tasks/s, through a worker", "ms"),
    ("tp_apply_async_vs_send_task_confirmed", "`apply_async` (confirm each), share of Celery's own with `confirm_publish`", ""),
    ("tp_apply_async_batch_vs_send_task", "`apply_async` in `batch()`, share of Celery's unconfirmed `send_task`", ""),
    ("tp_apply_async_batch_vs_native", "`apply_async` in `batch()`, vs Celery's native delayed delivery with confirms", "x"),
    ("index_cost_schedule_batch", "Scheduling with the pending/cancel index, share of without (in `batch()`)", ""),
    ("index_cost_schedule", "Scheduling with the pending/cancel index, share of without (confirm each)", ""),
)


#: An earlier run shown beside the latest in the headline table: (label, its latest.json).
BASELINE = ("ddf578f", ROOT / "benchmarks/results/ddf578f/latest.json")


def baseline_for(doc: dict[str, object]) -> tuple[str, dict[str, object]] | None:
    """:data:`BASELINE` as ``(label, its latest.json)``, or ``None`` when absent or when ``doc`` is that run."""
    import json

    if not BASELINE[1].exists():
        return None
    base: dict[str, object] = json.loads(BASELINE[1].read_text())
    return None if base.get("started") == doc.get("started") else (BASELINE[0], base)


def _value(t: dict[str, object] | None, unit: str) -> str | None:
    measured = t.get("measured") if t else None
    if measured is None:
        return None
    return f"{measured:,.2f} {unit}".strip() if isinstance(measured, float) else str(measured)


def glance(doc: dict[str, object], baseline: tuple[str, dict[str, object]] | None = None) -> str:
    """A short table of the headline targets of one run (latest.json), with how it was measured.

    With ``baseline`` = ``(label, an earlier run's latest.json)``, that run's figure stands beside each.
    """
    targets = {t["key"]: t for t in doc.get("targets", [])}  # type: ignore[union-attr,index]
    before = {t["key"]: t for t in baseline[1].get("targets", [])} if baseline else {}  # type: ignore[union-attr,index]
    extra = f" {baseline[0]} |" if baseline else ""
    rows = [f"| measured in one run, side by side | celery_delayq |{extra} compared with |",
            "|---|---|" + ("---|" if baseline else "") + "---|"]
    for key, label, unit in GLANCE:
        t = targets.get(key)
        value = _value(t, unit)
        if t is None or value is None:
            continue
        old = f" {_value(before.get(key), unit) or '-'} |" if baseline else ""
        rows.append(f"| {label} | **{value}** |{old} {t['detail']} |")
    started = str(doc.get("started", ""))[:10]
    since = f"; the {baseline[0]} column is the run committed at {baseline[0]}, for comparison" if baseline else ""
    rows += ["", f"`./dev bench --quick` ({doc.get('mode')} mode, {started}, this 2-core machine: broker, "
                 f"publishers and workers share it{since}). Every peer runs in the same run; the full tables "
                 "are in [docs/benchmarks.md](docs/benchmarks.md)."]
    return "\n".join(rows)


SATURATION_START, SATURATION_END = "<!-- SATURATION:START -->", "<!-- SATURATION:END -->"
#: The saturation runs on private nodes (benchmarks/faults/shapes.py) and ddf578f's, for the README.
SATURATION_FILES = {
    "burst": ROOT / "benchmarks/results/shapes_quiet.json",
    "buckets": ROOT / "benchmarks/results/buckets.json",
    "million_default": ROOT / "benchmarks/results/million_default.json",
    "million": ROOT / "benchmarks/results/million.json",
    "base_burst": ROOT / "benchmarks/results/ddf578f/scale.json",
    "base_million": ROOT / "benchmarks/results/ddf578f/full.json",
}
#: Columns of the saturation table: (shape in the runs, heading).
SATURATION_COLUMNS = (("default", "**the default** (buckets; its run's `fixed` = 1.00)"),
                      ("14x4", "ladder 14x4 (the default before buckets)"),
                      ("7x16", "ladder 7x16"), ("fixed", "`fixed` backend"))


def saturation(docs: dict[str, dict[str, Any]]) -> str:
    """The README's saturation table (pure): drain of a burst and lateness of 1,000,000, per shape, beside ddf578f."""
    def row_of(doc: dict[str, Any] | None, shape: str, line: str) -> dict[str, Any] | None:
        rows = (doc or {}).get("rows", [])
        return next((r for r in rows if r.get("shape") == shape and str(r.get("broker", "")).startswith(line)
                     and r.get("dl_prefetch", 32) == 32), None)

    def base_burst(line: str) -> str:
        r = next((r for r in docs.get("base_burst", {}).get("rows", [])
                  if str(r["broker"]).startswith(line) and r["nodes"] == 1 and r["shards"] == 1), None)
        return f"{r['drain_per_s']:,.0f}/s ({r['published']:,} tasks)" if r else "-"

    burst = docs.get("burst")
    # The million with the default and `fixed` in one run first, then the ladder shapes' earlier one.
    million = {"rows": [r for key in ("million_default", "million") for r in (docs.get(key) or {}).get("rows", [])]}
    shown = (burst or {}).get("rows", []) + million["rows"]
    clean = all(r.get("lost") == 0 and r.get("early") == 0 for r in shown)
    lines = [f"| at saturation, one node{'; nothing lost or early in any run' if clean else ' (some runs lost or early: see the tables)'} | "
             + " | ".join(h for _, h in SATURATION_COLUMNS) + " | ddf578f (its default) |",
             "|---|" + "---|" * (len(SATURATION_COLUMNS) + 1)]
    def default_of(line: str) -> str:
        """The shipped default's drain over `fixed`'s in its own run (buckets.json: the latest such run)."""
        for run in reversed((docs.get("buckets") or {}).get("runs", [])):
            rows = [r for r in run["rows"] if str(r["broker"]).startswith(line)]
            fixed = [r["drain_per_s"] for r in rows if r["shape"] == "fixed"]
            mine = next((r for r in rows if r.get("default")), None)
            if mine and fixed:
                return f"**{mine['drain_per_s'] / (sum(fixed) / len(fixed)):.2f}×**"
        return "-"

    for line, label in (("4.", "RabbitMQ 4.3"), ("3.", "RabbitMQ 3.10")):
        cells = [row_of(burst, shape, line) for shape, _ in SATURATION_COLUMNS]
        tasks = next((c["published"] for c in cells if c), 0)
        lines.append(f"| {tasks:,} due at once, drained per second, {label} | {default_of(line)} | "
                     + " | ".join(f"**{c['drain_per_s']:,.0f}**" if c else "-" for c in cells[1:])
                     + f" | {base_burst(line)} |")
        lines.append(f"| broker CPU per delivered task (µs), {label} | "
                     + " | ".join(f"{c['broker_cpu_us_per_task']:,}" if c else "-" for c in cells) + " | - |")
    if million["rows"]:
        cells = [row_of(million, shape, "4.") for shape, _ in SATURATION_COLUMNS]
        base = (docs.get("base_million", {}).get("results") or {}).get("capacity") or {}
        late = (base.get("lateness") or {}).get("max_ms")
        before = f"{late / 1000:,.0f} s (3.10, its default ladder)" if late is not None else "-"
        lines.append(f"| 1,000,000 due within one minute: the last one late by, RabbitMQ 4.3 | "
                     + " | ".join(f"**{c['late_max_s']:,.0f} s**" if c else "-" for c in cells) + f" | {before} |")
    when = (burst or {}).get("when", "")
    dates = {key: (docs.get(key) or {}).get("when") for key in ("million_default", "million")}
    if million["rows"] and all(dates.values()):
        when += f"; the million: the default and `fixed` {dates['million_default']}, the ladders {dates['million']}"
    if docs.get("buckets"):
        when += (f"; the default's drain: over `fixed`'s in the same run, {docs['buckets'].get('when')}, "
                 "[buckets.md](benchmarks/results/buckets.md)")
    lines += ["", f"`python -m benchmarks.faults.shapes` ({when}, private nodes of both lines on this 2-core machine, "
                  "nothing else running; full tables and what limits them: "
                  "[docs/benchmarks.md](docs/benchmarks.md#issue-25-throughput-near-the-brokers-limit))."]
    return "\n".join(lines)


def saturation_docs() -> dict[str, dict[str, Any]]:
    """The files :func:`saturation` reads, those that exist."""
    import json

    return {k: json.loads(p.read_text()) for k, p in SATURATION_FILES.items() if p.exists()}


@click.command()
@click.option("--readme", type=click.Path(path_type=Path), default=ROOT / "README.md", show_default=True,
              help="Where the headline table goes (GLANCE markers).")
@click.option("--tables", "tables_path", type=click.Path(path_type=Path), default=ROOT / "docs/benchmarks.md",
              show_default=True, help="Where the full tables go (BENCHMARKS markers).")
@click.option("--quick", "quick_path", type=click.Path(path_type=Path),
              default=ROOT / "benchmarks/results/latest.md", show_default=True)
@click.option("--full", "full_path", type=click.Path(path_type=Path),
              default=ROOT / "benchmarks/results/full/latest.md", show_default=True)
def main(readme: Path, tables_path: Path, quick_path: Path, full_path: Path) -> None:
    """Rewrite the benchmark tables and the README's headline table from the results files."""
    tables = tables_path.read_text()
    if START not in tables or END not in tables:
        raise click.ClickException(f"{tables_path} has no {START} ... {END} block")
    full_md = full_path.read_text() if full_path.exists() else None
    new = block(quick_path.read_text(), full_md)
    before, rest = tables.split(START, 1)
    _, after = rest.split(END, 1)
    tables_path.write_text(f"{before}{START}\n{new}\n{END}{after}")
    text = readme.read_text()
    json_path = quick_path.with_suffix(".json")
    if GLANCE_START in text and json_path.exists():
        import json

        head, rest = text.split(GLANCE_START, 1)
        _, tail = rest.split(GLANCE_END, 1)
        doc = json.loads(json_path.read_text())
        text = f"{head}{GLANCE_START}\n{glance(doc, baseline_for(doc))}\n{GLANCE_END}{tail}"
    if SATURATION_START in text:
        head, rest = text.split(SATURATION_START, 1)
        _, tail = rest.split(SATURATION_END, 1)
        text = f"{head}{SATURATION_START}\n{saturation(saturation_docs())}\n{SATURATION_END}{tail}"
    readme.write_text(text)
    click.echo(f"updated {tables_path} and {readme} from {quick_path}" + (f" and {full_path}" if full_md else ""))


if __name__ == "__main__":
    main()
