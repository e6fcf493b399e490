"""Run the celery_delayq benchmark suite and write ``results/latest.{json,md}``.

    python benchmarks/run.py --quick     # a few minutes (CI)
    python benchmarks/run.py --full      # hours; adds 1,000,000 pending messages

Needs a RabbitMQ at 127.0.0.1:5672 (``DELAYQ_BENCH_BROKER_HOST`` to change)
and ``rabbitmqctl`` on the PATH: every scenario runs in a vhost of its own,
deleted afterwards, so nothing is left on the broker.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import json
import shlex
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import click

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

from benchmarks.common import (  # noqa: E402
    RESULTS_DIR, Budget, ForeignLoad, broker_alive, delete_stale_vhosts, dump_json, machine_info,
)
from benchmarks.pool import ChildPool  # noqa: E402
from benchmarks.report import markdown, targets  # noqa: E402
from benchmarks.scenarios import MODES, ORDER, Ctx  # noqa: E402

POOL_SIZE = 9  # 8 publishers + 1 consumer


def _run_scenario(name: str, ctx: Ctx, doc: dict[str, Any]) -> bool:
    """Run one scenario into ``ctx.results``; False if the broker went away."""
    module = importlib.import_module(f"benchmarks.scenarios.{name}")
    _log(f"{module.TITLE} ...")
    t0 = time.monotonic()
    foreign = ForeignLoad().__enter__()
    try:
        ctx.results[name] = module.run(ctx)
    except Exception:  # noqa: BLE001 - one broken scenario must not lose the others
        tb = traceback.format_exc()
        doc["errors"][name] = tb
        ctx.results[name] = {"error": tb.strip().splitlines()[-1]}
        _log(f"{name} FAILED:\n{tb}")
        if not broker_alive(timeout=8):
            _log("the broker stopped accepting connections; stopping here")
            return False
    finally:
        doc["scenario_seconds"][name] = round(time.monotonic() - t0, 1)
        foreign.__exit__(None, None, None)
        doc.setdefault("scenario_foreign_cpu", {})[name] = round(foreign.fraction, 3)
    _log(f"{name} done in {doc['scenario_seconds'][name]:.0f} s (total {ctx.budget.elapsed():.0f} s)")
    partial = ctx.results.get("_partial")
    if partial is not None:  # a long run that dies still leaves what it measured
        out_dir, pdoc = partial
        with contextlib.suppress(Exception):
            dump_json(out_dir / "partial.json",
                      {**pdoc, "results": {k: v for k, v in ctx.results.items() if not k.startswith("_")}})
    return True


def _log(msg: str) -> None:
    stamp = _dt.datetime.now().strftime("%H:%M:%S")
    click.echo(f"[{stamp}] {msg}", err=True)


@click.command()
@click.option("--quick", "mode", flag_value="quick", help="A few minutes; the CI mode.")
@click.option("--full", "mode", flag_value="full", help="Everything at full size (long).")
@click.option("--only", default="", help=f"Comma-separated scenarios to run ({', '.join(ORDER)}).")
@click.option("--skip", default="", help="Comma-separated scenarios to leave out.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=RESULTS_DIR,
              show_default=True, help="Directory for latest.json and latest.md.")
@click.option("--strict", is_flag=True, help="Exit with status 2 when a target fails.")
@click.option("--merge", is_flag=True,
              help="Keep the results of scenarios not run now from the existing latest.json in --out "
                   "(to re-run or resume single scenarios of a long run).")
@click.option("--render", "render_from", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Only re-render the Markdown (and targets) from an existing JSON result.")
def main(mode: str | None, only: str, skip: str, out_dir: Path, strict: bool, merge: bool,
         render_from: Path | None) -> None:
    """Benchmark celery_delayq against Celery native, classic ETA and a naive TTL queue."""
    if render_from is not None:
        doc = json.loads(render_from.read_text())
        doc["targets"] = [t.as_dict() for t in targets(doc["results"])]
        dump_json(render_from, doc)
        md_path = render_from.with_suffix(".md")
        md_path.write_text(markdown(doc))
        _log(f"re-rendered {md_path}")
        return
    if mode is None:
        raise click.UsageError("choose --quick or --full")
    cfg = MODES[mode]
    names = [n for n in ORDER if (not only or n in only.split(",")) and n not in skip.split(",")]
    unknown = [n for n in (only.split(",") if only else []) + (skip.split(",") if skip else []) if n not in ORDER]
    if unknown:
        raise click.UsageError(f"unknown scenario(s): {', '.join(unknown)}")
    if not broker_alive(timeout=8):
        raise click.ClickException("RabbitMQ does not accept connections at the benchmark broker address")
    stale = delete_stale_vhosts()
    if stale:
        _log(f"deleted {len(stale)} vhost(s) left by an interrupted run: {', '.join(stale)}")

    started = _dt.datetime.now(_dt.timezone.utc)
    budget = Budget(cfg.budget_s)
    doc: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, "benchmarks/run.py", *sys.argv[1:]]),
        "mode": mode, "started": started.isoformat(timespec="seconds"), "machine": machine_info(),
        "config": cfg.as_dict(), "scenario_seconds": {}, "errors": {}, "results": {},
    }
    _log(f"{mode} mode: {', '.join(names)}")
    previous: dict[str, Any] = {}
    if merge and (out_dir / "latest.json").exists():
        old = json.loads((out_dir / "latest.json").read_text())
        if old.get("mode") == mode:
            previous = old
            doc["merged_from"] = {k: old.get("started") for k in old["results"] if k not in names}
    background = {bg: fg for bg, fg in cfg.overlap if bg in names and fg in names}
    with ChildPool(POOL_SIZE) as pool:
        ctx = Ctx(cfg=cfg, pool=pool, budget=budget, log=_log,
                  results={k: v for k, v in previous.get("results", {}).items() if k not in names})
        for key in ("scenario_seconds", "scenario_foreign_cpu", "errors"):
            doc.setdefault(key, {}).update({k: v for k, v in previous.get(key, {}).items() if k not in names})
        ctx.results["_partial"] = (out_dir, doc)
        waiting: dict[str, tuple[threading.Thread, ChildPool]] = {}
        for name in names:
            if name in background:  # runs in a thread, with its own children, next to its partner
                side_pool = ChildPool(POOL_SIZE - 2)
                side_ctx = Ctx(cfg=cfg, pool=side_pool, budget=budget, log=_log, results=ctx.results,
                               concurrent_with=background[name])
                thread = threading.Thread(target=_run_scenario, args=(name, side_ctx, doc), daemon=True)
                thread.start()
                waiting[background[name]] = (thread, side_pool)
                continue
            if not _run_scenario(name, ctx, doc):
                break
            if name in waiting:
                thread, side_pool = waiting.pop(name)
                thread.join()
                side_pool.close()
        for thread, side_pool in waiting.values():
            thread.join()
            side_pool.close()
    stale = delete_stale_vhosts(only_own=True)
    if stale:
        _log(f"cleaned up {len(stale)} vhost(s) a failed scenario left behind")

    doc["results"] = {k: v for k, v in ctx.results.items() if not k.startswith("_")}
    doc["duration_s"] = round(budget.elapsed(), 1)
    ts = targets(doc["results"])
    doc["targets"] = [t.as_dict() for t in ts]
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_json(out_dir / "latest.json", doc)
    md = markdown(doc)
    (out_dir / "latest.md").write_text(md)
    (out_dir / "partial.json").unlink(missing_ok=True)
    click.echo(md)
    _log(f"wrote {out_dir / 'latest.json'} and {out_dir / 'latest.md'} ({doc['duration_s']:.0f} s)")
    if doc["errors"]:
        sys.exit(1)
    if strict and any(t.status == "FAIL" for t in ts):
        sys.exit(2)


if __name__ == "__main__":
    main()
