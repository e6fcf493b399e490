"""A confirmed ``apply_async``'s publishing process under valgrind's cache and branch simulation.

    python benchmarks/cache_sim.py
    DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=.venv/rmq4-bin:$PATH python benchmarks/cache_sim.py

On this machine a confirmed delayed call's thread executes 0.94–0.95 of the instructions of Celery's own
confirmed publish but spends 0.79–0.90 of its CPU time (``share_interleaved.py``): the difference is time per
instruction, which ``perf`` cannot count here (no hardware counters). ``valgrind --tool=cachegrind
--cache-sim=yes --branch-sim=yes`` simulates the caches and branch predictors instead: repeatable counts,
whatever else the machine is doing, of what makes an instruction slow. Each mode of ``publish_share.py``'s
child (Celery's ``celery_confirmed``; the ladder's ``delayq``, with and without the index of waiting tasks)
runs twice under cachegrind, 100 and 400 calls; the difference over 300 is per call, the whole process
(every thread: under valgrind the index writer's thread writes a few entries per message, so its share is
overstated). In a ``dqbench-cache-*`` vhost deleted afterwards.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (RESULTS_DIR as RESULTS, broker_version, script_argv, vhost,  # noqa: E402
                               write_line_results)
from benchmarks.publish_share import under_valgrind  # noqa: E402

MODES = ("celery_confirmed", "delayq", "delayq_noindex")
CALLS = (100, 400)
#: cachegrind's events shown, with what they count.
EVENTS = (("Ir", "instructions"), ("I1mr", "instruction cache misses (L1)"), ("D1mr", "data read misses (L1)"),
          ("D1mw", "data write misses (L1)"), ("Bcm", "conditional branches mispredicted"),
          ("Bim", "indirect branches mispredicted"))


def read_summary(text: str) -> dict[str, int]:
    """``event -> count`` of a cachegrind output file's ``events:`` and ``summary:`` lines (pure)."""
    events = re.search(r"^events: (.+)$", text, re.M)
    summary = re.search(r"^summary: (.+)$", text, re.M)
    if events is None or summary is None:
        raise click.ClickException("no events/summary line in cachegrind's output")
    return dict(zip(events.group(1).split(), (int(v) for v in summary.group(1).split())))


def per_call(small: dict[str, int], large: dict[str, int], calls: int) -> dict[str, float]:
    """Each event's count per call between two runs ``calls`` calls apart (pure)."""
    return {k: (large[k] - small[k]) / calls for k in large if k in small}


def count(mode: str, url: str, calls: int, tmp: Path) -> dict[str, int]:
    """cachegrind's summary of ``mode``'s child making ``calls`` confirmed calls (``countdown=900``)."""
    out = tmp / f"{mode}-{calls}"
    done = under_valgrind(["--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes", f"--cachegrind-out-file={out}"],
                          mode, url, calls, 900.0, timeout=3600)
    if done.returncode:
        raise click.ClickException(f"{mode} under cachegrind failed: {done.stderr[-2000:]}")
    return read_summary(out.read_text(errors="replace"))


def markdown(doc: dict[str, Any]) -> str:
    """The committed table (pure): each event per call per mode, and Celery's over each delayed mode's."""
    runs = doc["runs"]
    lines = [f"# A confirmed `apply_async` under cache and branch simulation ({doc['broker']}, {doc['when']})", "",
             f"`{doc['argv']}`: valgrind's cachegrind, `--cache-sim=yes --branch-sim=yes`, the whole publishing "
             f"process (every thread), {doc['calls'][1]} calls less {doc['calls'][0]}; per call, and "
             "`celery_confirmed` over each mode.", "",
             "| event | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
    base = runs["celery_confirmed"]
    for event, what in EVENTS:
        cells = []
        for mode in MODES:
            value = runs[mode][event]
            cells.append(f"{value / 1000:,.1f}k" + ("" if mode == "celery_confirmed" else
                                                     f" ({base[event] / value:.2f})"))
        lines.append(f"| {what} (`{event}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(out: Path) -> None:
    """Count each mode; write cache_sim.md and .json under --out."""
    if shutil.which("valgrind") is None:
        raise click.ClickException("valgrind is not installed (Debian: apt-get install valgrind)")
    runs = {}
    with vhost("cache") as vh, tempfile.TemporaryDirectory(prefix="cache-sim-") as tmp:
        for mode in MODES:
            small, large = (count(mode, vh.url, n, Path(tmp)) for n in CALLS)
            runs[mode] = {k: round(v, 1) for k, v in per_call(small, large, CALLS[1] - CALLS[0]).items()}
            click.echo(f"  {mode}: {runs[mode]}", err=True)
    doc = {"when": time.strftime("%Y-%m-%d"), "broker": broker_version(), "calls": list(CALLS),
           "argv": script_argv("benchmarks/cache_sim.py"), "runs": runs}
    write_line_results(out, "cache_sim", doc, markdown(doc))


if __name__ == "__main__":
    main()
