"""A delayed ``apply_async`` beside Celery's own undelayed one, and where the difference goes.

    python benchmarks/publish_share.py                # 3 alternations, 2,000 calls x best of 5 rounds
    DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=.venv/rmq4-bin:$PATH python benchmarks/publish_share.py

The broker is the benchmarks' (``DELAYQ_BENCH_BROKER_HOST``, ``rabbitmqctl`` on the
``PATH``: :mod:`benchmarks.common`). Each mode runs in a fresh process of its own (as
the apps of users do), in a ``dqbench-share-*`` vhost that is deleted afterwards:

* ``celery_confirmed``: Celery's ``apply_async``, no delay, ``confirm_publish``
  into a quorum queue: Celery's cost plus one confirm round trip;
* ``celery_countdown_confirmed``: the same with ``countdown=900`` (classic ETA, no ladder): Celery's own
  delayed publish, confirmed, the peer that pays for a countdown as ours does;
* ``delayq``: ``apply_async(countdown=900)``, confirm each: beyond ``delayq_bucket_max_delay``
  (600 s), so through the ladder;
* ``delayq_repeat``: ``apply_async(countdown=300)``, confirm each: a countdown the process repeats,
  so after 100 calls (the warm-up's) its own one-hop queue (the default's recurring delays);
* ``celery_unconfirmed``: Celery's ``apply_async``, no delay, no confirms (Celery's default);
* ``celery_countdown_unconfirmed``: the same with ``countdown=900`` (classic ETA, no ladder):
  what Celery's own countdown handling costs;
* ``delayq_batch``, ``delayq_batch_repeat``: ``delayq`` and ``delayq_repeat`` in ``celery_delayq.batch()``.

Each delayed mode states the hops of the path it measured (one more call after the timed rounds, read from
the ``message_scheduled`` signal): a countdown under ``delayq_bucket_max_delay`` that the process repeats
takes its one-hop queue, so a "ladder" mode with 1 hop would be measuring the wrong path.

Per mode: the best of ``--rounds`` rounds by wall time per call, with its CPU time
per call, and the broker's CPU per call over the timed rounds (``/proc`` of the node's
OS process, read by the child: the broker shares this machine's CPUs with the publisher;
a child's connecting and declaring are not in it); then one
profiled round per mode whose time is summed by package (``celery``, ``kombu``,
``amqp``, ``celery_delayq``, the standard library, the socket): what the ladder's
path spends that Celery's own does not.

``--instructions`` also counts the instructions each mode's publishing process
executes per call (``valgrind --tool=callgrind``: a child of 100 calls subtracted
from one of 600), which the machine's noise does not move: the client's CPU work,
apart from the broker's and from waiting. Counted per thread: every thread, and the
calling thread alone (the one ``apply_async`` runs in). They differ by the index
writer's timer thread, which valgrind's ~50x slowdown makes flush a few entries at a
time, so its share under valgrind is an upper bound; the calling thread's share is
the call's own work.
"""

from __future__ import annotations

import json
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import click

# This checkout's benchmarks package (run as a script from the repository root).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (REPO_ROOT as ROOT, RESULTS_DIR as RESULTS, TMP_DIR, broker_pid,  # noqa: E402
                               broker_version, script_argv, vhost, write_line_results)
MODES = ("celery_confirmed", "celery_countdown_confirmed", "delayq", "delayq_repeat", "celery_unconfirmed",
         "celery_countdown_unconfirmed", "delayq_batch", "delayq_batch_repeat")

_CHILD = r'''
import contextlib, cProfile, json, sys, time
from celery import Celery
from kombu import Queue
mode, n, rounds, url, profile_to = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
countdown = float(sys.argv[6])
broker_pid = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] != "-" else None
from benchmarks.common import cpu_s_of  # the child runs in the repository root
app = Celery("share", broker=url, set_as_current=False)
q = "share-" + mode
if mode.startswith("delayq"):
    import celery_delayq
    app.conf.update(delayq_enabled=True, delayq_prefix="share", task_default_queue=q,
                    delayq_index=not mode.endswith("_noindex"))  # _noindex: benchmarks/cache_sim.py's
elif mode in ("celery_confirmed", "celery_countdown_confirmed"):
    app.conf.update(task_default_queue=q, task_queues=[Queue(q, queue_arguments={"x-queue-type": "quorum"})],
                    broker_transport_options={"confirm_publish": True})
else:
    app.conf.update(task_default_queue=q)

@app.task(name="share.noop")
def noop(x):
    return x

kw = {"countdown": countdown} if mode.startswith("delayq") or "countdown" in mode else {}

def block():
    if mode.startswith("delayq_batch"):
        import celery_delayq
        return celery_delayq.batch(app)
    return contextlib.nullcontext()

with block():
    for _ in range(200):
        noop.apply_async((1,), **kw)
if rounds == 0:  # counted by valgrind: the calls only
    with block():
        for _ in range(n):
            noop.apply_async((1,), **kw)
    print(json.dumps({"mode": mode}))
    sys.exit(0)
best = None
broker_before = cpu_s_of(broker_pid)
for _ in range(rounds):
    c0, w0 = time.process_time(), time.perf_counter()
    with block():
        for _ in range(n):
            noop.apply_async((1,), **kw)
    wall, cpu = (time.perf_counter() - w0) / n * 1e6, (time.process_time() - c0) / n * 1e6
    if best is None or wall < best[0]:
        best = (wall, cpu)
broker_after = cpu_s_of(broker_pid)
hops = None
if mode.startswith("delayq"):  # the path measured: one more call, its route read from the signal
    from celery_delayq import signals
    seen = []
    def grab(sender=None, plan=None, **_kw):
        seen.append(plan.hops)
    signals.message_scheduled.connect(grab, weak=False)
    with block():
        noop.apply_async((1,), **kw)
    signals.message_scheduled.disconnect(grab)
    hops = seen[-1] if seen else None
broker_us = (None if broker_before is None or broker_after is None
             else round((broker_after - broker_before) / (rounds * n) * 1e6, 1))
prof = cProfile.Profile()
prof.enable()
with block():
    for _ in range(n):
        noop.apply_async((1,), **kw)
prof.disable()
prof.dump_stats(profile_to)
print(json.dumps({"mode": mode, "wall_us": round(best[0], 1), "cpu_us": round(best[1], 1),
                  "rate": round(1e6 / best[0], 1), "hops": hops, "broker_cpu_us": broker_us}))
'''


#: Calls of the two children of :func:`instructions_per_call` (their difference is what is counted).
INSTRUCTION_CALLS = (100, 600)


def under_valgrind(options: Sequence[str], mode: str, url: str, calls: int, countdown: float, *,
                   timeout: float) -> subprocess.CompletedProcess[str]:
    """``mode``'s child making ``calls`` calls and nothing else (no timed rounds, no profile) under ``valgrind``
    with ``options`` (the tool and its output file); its output is the caller's to read."""
    return subprocess.run(["valgrind", *options, sys.executable, "-c", _CHILD, mode, str(calls), "0", url, "-",
                           str(countdown)], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def instructions_per_call(mode: str, url: str, countdown: float) -> dict[str, float] | None:
    """Instructions per call of ``mode``'s publishing process (thousands): ``{"all": every thread, "calling": the
    calling thread}``; ``None``: no valgrind."""
    if shutil.which("valgrind") is None:
        return None
    counts = []
    with tempfile.TemporaryDirectory(prefix="share-callgrind-") as tmp:
        for calls in INSTRUCTION_CALLS:
            out = Path(tmp) / f"calls{calls}"
            done = under_valgrind(["--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}"],
                                  mode, url, calls, countdown, timeout=1800)
            if done.returncode or "Collected" not in done.stderr:
                raise click.ClickException(f"{mode} under valgrind failed: {done.stderr[-2000:]}")
            counts.append(thread_counts(sorted(Path(tmp).glob(f"calls{calls}-*"))))
    span = INSTRUCTION_CALLS[1] - INSTRUCTION_CALLS[0]
    return {"all": (sum(counts[1]) - sum(counts[0])) / span / 1000,
            "calling": (counts[1][0] - counts[0][0]) / span / 1000}


def thread_counts(files: Sequence[Path]) -> list[int]:
    """The instructions of each thread, from callgrind's ``--separate-threads`` files in thread order (the main,
    calling thread first): each file's ``summary:`` line (pure but for reading the files)."""
    found = []
    for f in files:
        summary = re.search(r"^summary: (\d+)", f.read_text(errors="replace"), re.M)
        if summary is None:
            raise click.ClickException(f"no summary in callgrind output {f}")
        found.append(int(summary.group(1)))
    if not found:
        raise click.ClickException("callgrind wrote no per-thread output")
    return found


def package_of(filename: str) -> str:
    """The package a profiled function belongs to (pure): celery_delayq, celery, kombu, amqp, stdlib, socket."""
    if filename == "~":
        return "builtins (socket, encoding)"
    for name in ("celery_delayq", "kombu", "amqp", "celery", "vine", "dateutil"):
        if f"/{name}/" in filename:
            return name
    return "standard library"


def by_package(profile: str, calls: int) -> dict[str, float]:
    """µs per call spent in each package's own code (tottime), from a profile dump."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for (filename, _line, _fn), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        key = package_of(filename)
        out[key] = out.get(key, 0.0) + tottime / calls * 1e6
    return out


#: The shares the tables give: (ours, peer, what it says), in the order printed.
SHARES = (
    ("delayq", "celery_confirmed", "`apply_async` confirm each, ladder / Celery with `confirm_publish`"),
    ("delayq_repeat", "celery_confirmed",
     "`apply_async` confirm each, a repeated countdown (its one-hop queue) / Celery with `confirm_publish`"),
    ("delayq", "celery_countdown_confirmed",
     "`apply_async` confirm each, ladder / Celery with `confirm_publish`, same countdown"),
    ("delayq_batch", "celery_unconfirmed", "`apply_async` in `batch()`, ladder / Celery unconfirmed, no delay"),
    ("delayq_batch_repeat", "celery_unconfirmed",
     "`apply_async` in `batch()`, a repeated countdown / Celery unconfirmed, no delay"),
    ("delayq_batch", "celery_countdown_unconfirmed",
     "`apply_async` in `batch()`, ladder / Celery unconfirmed, same countdown"),
    ("celery_countdown_unconfirmed", "celery_unconfirmed", "Celery's own countdown / no countdown, unconfirmed"),
)


def modes_of(doc: dict[str, Any]) -> list[str]:
    """The modes a run measured, in :data:`MODES` order (pure): results of an earlier version lack later modes."""
    run = {r["mode"] for r in doc["runs"]}
    return [m for m in MODES if m in run]


def markdown(doc: dict[str, Any]) -> str:
    """The committed table (pure)."""
    modes = modes_of(doc)
    best = {m: min((r for r in doc["runs"] if r["mode"] == m), key=lambda r: r["wall_us"]) for m in modes}
    rates = {m: [r["rate"] for r in doc["runs"] if r["mode"] == m] for m in modes}

    def shares(a: str, b: str) -> str:  # alternation k of mode a over alternation k of mode b
        return ", ".join(f"{x / y:.2f}" for x, y in zip(rates[a], rates[b]))

    countdowns = doc.get("countdowns") or {}
    lines = [f"# A delayed `apply_async` beside Celery's own ({doc['broker']}, {doc['when']})", "",
             f"`{doc['argv']}`: each mode in a process of its own, {doc['calls']:,} calls, best of {doc['rounds']} "
             f"rounds, {doc['alternations']} alternations of all modes.", "",
             "| mode | countdown (s) | hops of the path measured | calls/s (each alternation) | best wall µs/call | "
             "its CPU µs/call | broker CPU µs/call |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {m} | {_or_dash(countdowns.get(m))} | {_hops(doc, m)} | {', '.join(f'{x:,.0f}' for x in rates[m])} | "
              f"{best[m]['wall_us']} | {best[m]['cpu_us']} | {_broker_cpu(doc, m)} |" for m in modes]
    lines += ["", "Shares, per alternation (same run):", ""]
    lines += [f"- {text}: {shares(ours, peer)}" for ours, peer, text in SHARES if {ours, peer} <= set(modes)]
    lines += ["", *_instruction_lines(doc),
              "Where the time goes (one profiled round per mode; µs per call of each package's own code, "
              "inflated by the profiler alike in every column):", ""]
    packages = sorted({p for m in modes for p in doc["packages"][m]})
    lines += ["| package | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for p in packages:
        lines.append(f"| {p} | " + " | ".join(f"{doc['packages'][m].get(p, 0.0):.1f}" for m in modes) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(doc['packages'][m].values()):.1f}**" for m in modes) + " |")
    return "\n".join(lines) + "\n"


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _hops(doc: dict[str, Any], mode: str) -> str:
    """The hops every alternation of ``mode`` measured (``-``: a Celery mode; pure)."""
    found = sorted({r["hops"] for r in doc["runs"] if r["mode"] == mode and r.get("hops") is not None})
    return ", ".join(str(h) for h in found) or "-"


def _broker_cpu(doc: dict[str, Any], mode: str) -> str:
    """The median broker CPU per call of ``mode`` over the alternations (pure)."""
    found = [r["broker_cpu_us"] for r in doc["runs"] if r["mode"] == mode and r.get("broker_cpu_us") is not None]
    return f"{statistics.median(found):.0f}" if found else "-"


def instruction_counts(value: float | dict[str, float] | None) -> tuple[float, float | None] | None:
    """(every thread, calling thread) of a mode's count (pure): results before the per-thread count hold one
    number, every thread's."""
    if not value:
        return None
    if isinstance(value, dict):
        return value["all"], value.get("calling")
    return float(value), None


def _instruction_lines(doc: dict[str, Any]) -> list[str]:
    """The instructions table and its shares, when counted (pure)."""
    modes = modes_of(doc)
    counted = {m: c for m, v in (doc.get("instructions") or {}).items() if m in modes and (c := instruction_counts(v))}
    if not modes or not all(m in counted for m in modes):
        return []
    rows = [("every thread", {m: c[0] for m, c in counted.items()})]
    if all(c[1] for c in counted.values()):
        rows.append(("the calling thread", {m: c[1] for m, c in counted.items() if c[1]}))
    lines = ["Instructions per call of the publishing process (`--instructions`: callgrind, 600 calls less 100; the "
             "machine's noise does not move them; under valgrind a call is ~50x slower, so the index entries' "
             "0.25 s linger writes a few entries at a time: every thread's count holds an upper bound of the "
             "index's share" + (", the calling thread's is the call's own work):" if len(rows) > 1 else "):"), "",
             "| threads | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    lines += [f"| {label} | " + " | ".join(f"{row[m]:,.0f}k" for m in modes) + " |" for label, row in rows]
    lines.append("")
    for ours, peer, text in (s for s in SHARES if {s[0], s[1]} <= set(modes)):
        lines.append(f"- {text}: " + "; ".join(f"{row[peer] / row[ours]:.2f} ({label})" for label, row in rows))
    return [*lines, ""]


@click.command()
@click.option("--calls", default=2000, show_default=True)
@click.option("--rounds", default=5, show_default=True)
@click.option("--alternations", default=3, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
@click.option("--instructions", is_flag=True, help="Also count each mode's instructions per call (valgrind).")
@click.option("--countdown", default=900.0, show_default=True,
              help="The ladder modes' countdown (s), and Celery's countdown mode's. Beyond delayq_bucket_max_delay "
                   "(600): the ladder; the table's hops say which path was measured.")
@click.option("--repeat-countdown", default=300.0, show_default=True,
              help="The _repeat modes' countdown (s): under delayq_bucket_max_delay, repeated, so after 100 calls "
                   "its own one-hop queue.")
@click.option("--name", default="publish_share", show_default=True, help="The results' file name (without .md).")
def main(calls: int, rounds: int, alternations: int, out: Path, instructions: bool, countdown: float,
         repeat_countdown: float, name: str) -> None:
    """Run every mode alternately; write publish_share.md and .json under --out."""
    runs, packages, counted = [], {}, {}
    countdowns = {m: repeat_countdown if m.endswith("_repeat") else countdown
                  for m in MODES if "countdown" in m or m.startswith("delayq")}
    TMP_DIR.mkdir(parents=True, exist_ok=True)
    pid = broker_pid()  # each child reads the broker's CPU over its timed rounds only
    with vhost("share") as vh:
        for _ in range(alternations):
            for mode in MODES:
                prof = str(TMP_DIR / f"{vh.name}-{mode}.pstats")
                done = subprocess.run([sys.executable, "-c", _CHILD, mode, str(calls), str(rounds), vh.url, prof,
                                       str(countdowns.get(mode, 0.0)), str(pid or "-")],
                                      capture_output=True, text=True, timeout=900, cwd=ROOT)
                if done.returncode:
                    raise click.ClickException(f"{mode} failed: {done.stderr[-2000:]}")
                run = json.loads(done.stdout.strip().splitlines()[-1])
                runs.append(run)
                packages[mode] = by_package(prof, calls)
                click.echo(f"  {runs[-1]}", err=True)
        if instructions:
            for mode in MODES:
                counted[mode] = instructions_per_call(mode, vh.url, countdowns.get(mode, 0.0))
                click.echo(f"  {mode}: {counted[mode]} thousand instructions per call", err=True)
    broker = broker_version()
    doc = {"when": time.strftime("%Y-%m-%d"), "broker": broker, "calls": calls, "rounds": rounds,
           "alternations": alternations, "countdowns": countdowns, "argv": script_argv("benchmarks/publish_share.py"),
           "runs": runs, "packages": packages, "instructions": counted}
    write_line_results(out, name, doc, markdown(doc))


if __name__ == "__main__":
    main()
