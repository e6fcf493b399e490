"""The web page at scale: 100,000 tasks waiting, first page, id lookup and searches (``benchmarks/results/web.md``).

Publishes N delayed tasks (real ladder publishes, in ``batch()``) into a
throw-away vhost, then times, through the ASGI app in process (no network
in the way, the broker on loopback):

* ``GET /api/waiting`` and the HTML ``/waiting`` first page, cold (the whole
  index is read: no snapshot yet) and warm (the 3 s snapshot is reused),
* ``GET /api/waiting/{id}`` (one index shard, plus the cancel log),
* an argument search and an id-prefix search (both read the whole index),
* the two parts of a cold read: ``read_index`` alone and the cancel log alone.

Run: ``.venv/bin/python -m benchmarks.web_scale [--tasks 100000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from typing import Any, Callable

from benchmarks.common import RESULTS_DIR, broker_version, vhost


def _timed(fn: Callable[[], Any], rounds: int) -> tuple[list[float], Any]:
    out, last = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        last = fn()
        out.append(time.perf_counter() - started)
    return out, last


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()

    from celery import Celery
    from fastapi.testclient import TestClient

    import celery_delayq
    from celery_delayq.glue.app_ladder import index_of
    from celery_delayq.index import read_cancel_book, read_index
    from celery_delayq.web import create_app

    results: dict[str, Any] = {"tasks": opts.tasks, "rounds": opts.rounds, "broker": broker_version(),
                               "cpus": os.cpu_count(), "python": platform.python_version(),
                               "host_load_1m": os.getloadavg()[0]}
    with vhost("web") as vh:
        app = Celery("webbench", broker=vh.url, set_as_current=False)
        app.conf.update(delayq_enabled=True, delayq_prefix="wb", task_default_queue="wb.q", broker_heartbeat=0)
        celery_delayq.install(app)

        @app.task(name="bench.report", shared=False)
        def report(customer: str, n: int) -> None:  # never runs: nothing consumes wb.q
            pass

        rng = random.Random(7)
        started = time.perf_counter()
        ids: list[str] = []
        chunk = 2000
        for i in range(0, opts.tasks, chunk):
            with celery_delayq.batch(app):
                for j in range(i, min(i + chunk, opts.tasks)):
                    r = report.apply_async((f"customer-{j}", j), countdown=rng.uniform(3600, 86400))
                    ids.append(r.id)
        results["publish_s"] = round(time.perf_counter() - started, 1)
        client = TestClient(create_app(app))
        svc = client.app.state.delayq  # type: ignore[attr-defined]

        def cold_api() -> Any:
            svc.snapshot.invalidate()
            return client.get("/api/waiting", params={"limit": 50})

        def cold_html() -> Any:
            svc.snapshot.invalidate()
            return client.get("/waiting")

        probe = ids[len(ids) // 2]
        rows: dict[str, Any] = {}
        t, r = _timed(cold_api, opts.rounds)
        assert r.status_code == 200 and r.json()["total"] == opts.tasks, r.text[:300]
        rows["first page, API, cold (whole index read)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/api/waiting", params={"limit": 50}), opts.rounds)
        rows["first page, API, warm (snapshot, what a click gets)"] = (t, len(r.content))
        t, r = _timed(cold_html, opts.rounds)
        assert probe not in r.text or True
        rows["first page, HTML, cold"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/waiting?offset=50000"), opts.rounds)
        rows["page at offset 50,000, HTML, warm"] = (t, len(r.content))
        t, r = _timed(lambda: client.get(f"/api/waiting/{probe}"), opts.rounds)
        assert r.status_code == 200 and r.json()["task_id"] == probe, r.text[:300]
        rows["id lookup, API (one shard + cancel log)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/waiting", params={"id": probe}), opts.rounds)
        assert probe in r.text
        rows["id lookup, HTML (whole id)"] = (t, len(r.content))

        t, r = _timed(lambda: client.get("/api/waiting", params={"id": probe[:8]}), opts.rounds)
        assert r.json()["total"] >= 1
        rows["id prefix search, warm (snapshot)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/api/waiting", params={"args": f"customer-{opts.tasks - 1}'"}), opts.rounds)
        assert r.json()["total"] == 1, r.text[:300]
        rows["argument search, warm (snapshot)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/waiting", params={"args": "customer-4242"}), opts.rounds)
        rows["argument search, HTML, warm"] = (t, len(r.content))
        t, _ = _timed(lambda: read_index(*index_of(app)), opts.rounds)
        rows["part: read_index, all 16 shards"] = (t, 0)
        t, _ = _timed(lambda: read_index(*index_of(app), task_ids=[probe]), opts.rounds)
        rows["part: read_index, one shard"] = (t, 0)
        t, _ = _timed(lambda: read_cancel_book(*index_of(app)), opts.rounds)
        rows["part: cancel log read"] = (t, 0)
        results["rows"] = {k: {"median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3), "bytes": b}
                           for k, (v, b) in rows.items()}
        celery_delayq.uninstall(app)
    (RESULTS_DIR / "web.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"# delayq web at scale: {opts.tasks:,} tasks waiting", "",
             f"RabbitMQ {results['broker']}, {results['cpus']} cores shared with other work (1-min load "
             f"{results['host_load_1m']:.1f} at start), Python {results['python']}; the ASGI app in process "
             f"(no HTTP socket); {opts.rounds} rounds each; publishing the tasks took {results['publish_s']} s.",
             f"Command: `.venv/bin/python -m benchmarks.web_scale --tasks {opts.tasks} --rounds {opts.rounds}`.", "",
             "| what | median s | max s | response bytes |", "|---|---:|---:|---:|"]
    for k, v in results["rows"].items():
        lines.append(f"| {k} | {v['median_s']:.3f} | {v['max_s']:.3f} | {v['bytes']:,} |")
    (RESULTS_DIR / "web.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
