"""Gather several runs of the lateness scenario into one table (``results/lateness_quiet.md``).

    python benchmarks/lateness_runs.py benchmarks/results/lateness_quiet/*.json

Each argument is a run's ``latest.json`` (``python benchmarks/run.py --quick --only lateness``,
``DQB_LATENESS_ONLY`` to repeat some series, ``DELAYQ_BENCH_BROKER_HOST`` for the other line);
the 1,000/s rows of celery_delayq and of the worker's no-delay floor are listed per run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "lateness_quiet.md"


def table(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """The Markdown (pure): one row per 1,000/s series of each run."""
    lines = ["# Lateness at 1,000/s, several runs, both lines (issue #25)", "",
             "Each run: `python benchmarks/run.py --quick --only lateness` on a machine with nothing else running "
             "(`DQB_LATENESS_ONLY` where a run repeated some series). 'Other load' counted the chroot's 4.3 node as "
             "another process, so every 4.3 row was measured twice and the less disturbed kept. Burst p99: arrivals "
             "(or task starts) less than 1 ms apart that 99% of the messages came with ('-': not recorded yet).", "",
             "| run | broker | series | at | p50 ms | p99 ms | max ms | early | missing | burst p99 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, doc in runs:
        broker = (doc.get("machine") or {}).get("rabbitmq", "?")
        for r in doc["results"]["lateness"]["rows"]:
            if r.get("skipped") or r["offered"] != 1000 or (r["peer"], r["mode"]) not in (
                    ("delayq", "publish_batch"), ("delayq", "schedule_task_batch"), ("classic", "now")):
                continue
            series = "the worker with no delay (floor)" if r["mode"] == "now" else "celery_delayq"
            lines.append(f"| {name} ({doc['started'][:16]}) | {broker} | {series} | {r['at']} | {r['p50_ms']} | "
                         f"{r['p99_ms']} | {r['max_ms']} | {r['early']} | {r['missing']} | {r.get('burst_p99') or '-'} |")
    return "\n".join(lines) + "\n"


def main(paths: list[str]) -> None:
    runs = [(Path(p).stem, json.loads(Path(p).read_text())) for p in paths]
    OUT.write_text(table(sorted(runs, key=lambda r: r[1]["started"])))
    print(OUT.read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
