"""Where the broker's work goes while a ladder drains: Erlang reductions per process.

    python -m benchmarks.faults.drain_profile --shape 7x16 --only rmq4

Starts a private single node (port 5780), publishes a burst due together
(:func:`benchmarks.faults.scale.run_saturation`), and two seconds into the
drain reads every process's reductions twice, ``--window`` seconds apart
(``rabbitmqctl eval``; the CLI's own start costs a little CPU). The table
lists the processes that did the most work in between, named by their
registered name (a quorum queue's Ra server is named after its queue) or
their initial call, with their share of all reductions: which queue, which
dead-letter worker, which channel is the drain's bottleneck.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from .nodes import Cluster, usable_flavours
from .scale import RESULTS, run_saturation

#: Every live process's pid, reductions and name (registered, else its initial call), as one term.
_EVAL = ("L = [{pid_to_list(P), element(2, erlang:process_info(P, reductions)), "
         "case erlang:process_info(P, registered_name) of {registered_name, N} -> N; "
         "_ -> proc_lib:translate_initial_call(P) end} "
         "|| P <- erlang:processes(), erlang:process_info(P, reductions) =/= undefined], "
         "lists:flatten(io_lib:format(\"~w\", [L])).")


def parse(term: str) -> dict[str, tuple[int, str]]:
    """``{pid: (reductions, name)}`` from the eval's printed term (pure; pids print as char lists)."""
    out = {}
    for pid, reductions, name in re.findall(r"\{\[([\d,]+)\],(\d+),([^}]*)\}", term):
        name = name.strip("'")
        if name.startswith("{"):  # an initial call {M,F,A}: the pattern stopped at its closing brace
            name += "}"
        out["".join(chr(int(c)) for c in pid.split(","))] = (int(reductions), name)
    return out


def busiest(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]],
            top: int = 12) -> list[tuple[str, int, float]]:
    """``(name, reductions, share)`` of the ``top`` processes by work done between two readings (pure)."""
    deltas = sorted(((after[p][0] - before[p][0], after[p][1]) for p in after if p in before), reverse=True)
    total = sum(d for d, _ in deltas) or 1
    return [(name, d, d / total) for d, name in deltas[:top]]


def markdown(rows: list[tuple[str, int, float]], *, broker: str, shape: str, result: Any, window: float) -> str:
    """The committed table (pure)."""
    lines = [f"# Where the broker's work goes while a ladder drains ({broker}, {shape})", "",
             f"`python -m benchmarks.faults.drain_profile --shape {shape}`: {result.published:,} tasks due within one "
             f"second drained at {result.drain_per_s:,.0f}/s (broker CPU {result.broker_cpu_pct}%, lost "
             f"{result.lost}, early {result.early}); reductions of each process over {window:g} s of the drain.", "",
             "| process | reductions | share of all |", "|---|---|---|"]
    lines += [f"| `{name}` | {d:,} | {share:.1%} |" for name, d, share in rows]
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--shape", default="7x16", show_default=True, help="LEVELSxRADIX of the ladder.")
@click.option("--tasks", default=50_000, show_default=True)
@click.option("--window", default=3.0, show_default=True, help="Seconds between the two readings.")
@click.option("--only", type=click.Choice(["host", "rmq4"]), default="rmq4", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(shape: str, tasks: int, window: float, only: str, out: Path) -> None:
    """Profile one drain on a private node; write drain_profile.md under --out."""
    levels, radix = (int(x) for x in shape.split("x"))
    due_s = 40.0
    for flavour in usable_flavours(only, say=lambda text: click.echo(text, err=True)):
        with Cluster.start(flavour, size=1, base_port=5780, prefix="dqdrain") as cluster:
            node = cluster.nodes[0]
            done: dict[str, Any] = {}
            started = time.time()

            def saturate() -> None:
                done["result"] = run_saturation(
                    cluster, shards=1, tasks=tasks, procs=2, due_s=due_s, workdir=Path(tempfile.mkdtemp()),
                    extra=f", delayq_levels={levels}, delayq_radix={radix}")

            worker = threading.Thread(target=saturate)
            worker.start()
            time.sleep(max(0.0, started + due_s + 2.0 - time.time()))
            before = parse(node.ctl("eval", _EVAL).stdout)
            time.sleep(window)
            after = parse(node.ctl("eval", _EVAL).stdout)
            worker.join()
            result = done["result"]
            text = markdown(busiest(before, after), broker=result.broker, shape=shape, result=result, window=window)
            out.mkdir(parents=True, exist_ok=True)
            (out / "drain_profile.md").write_text(text)
            click.echo(text)


if __name__ == "__main__":
    main()
