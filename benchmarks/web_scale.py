"""The web page at scale: 100,000 tasks waiting, first page, id lookup, searches and the live view
(``benchmarks/results/web.md``, ``web.json``).

Publishes N delayed tasks (real ladder publishes, in ``batch()``) into a
throw-away vhost, then, through the ASGI app in process (no HTTP socket; the
app's own ``delayq web`` service, the broker on loopback):

1. times each row ``--rounds`` times, one after the other:

   * ``GET /api/waiting`` and the HTML ``/waiting`` first page, cold (the whole
     index is read: no snapshot yet) and warm (the kept list is reused),
   * a page deep in the list (``offset=99,950``: the last page) and at 50,000,
   * ``GET /api/waiting/{id}`` (one index shard, plus the cancel log) and the
     HTML lookup by whole id,
   * an argument search and an id-prefix search (both a pass over the kept list),
   * the Retries page and ``/api/waiting/groups`` (error groups: from the kept list),
   * the parts of a cold read: ``read_index`` alone (all shards, one shard) and the cancel log;

2. the live view, for real (``--live-seconds``, 0 to skip): ``--pollers`` threads
   poll ``GET /api/changes`` once per ``POLL_S`` as an open page does (and fetch
   their page again when the signal says it changed after they drew it), while
   the first page (API and HTML), an id lookup and an argument search are timed
   every 0.5 s. Every whole-index read the process makes is counted (the
   ``read_index`` the package calls is wrapped: a read of every shard counts,
   a one-shard lookup does not), with when it started and how long it took;
   the pollers record the age of the list behind each signal (``now - read_at``).

The results of each broker line (``3.10``, ``4.3``) are kept side by side in
``web.json``; ``web.md`` is written from all of them, and keeps whatever
follows its ``<!-- by hand -->`` line.

Run: ``.venv/bin/python -m benchmarks.web_scale [--tasks 100000] [--rounds 3] [--live-seconds 30] [--pollers 5]``
(another broker: ``DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=/work/main/.venv/rmq4-bin:$PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import threading
import time
from typing import Any, Callable

from benchmarks.common import RESULTS_DIR, broker_version, vhost

HAND = "<!-- by hand: the tool keeps what follows -->"


def _timed(fn: Callable[[], Any], rounds: int) -> tuple[list[float], Any]:
    out, last = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        last = fn()
        out.append(time.perf_counter() - started)
    return out, last


def _q(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def _stats(values: list[float], ndigits: int = 3) -> dict[str, Any]:
    return {"n": len(values), "median": round(statistics.median(values), ndigits),
            "p95": round(_q(values, 0.95), ndigits), "max": round(max(values), ndigits)}


class IndexReads:
    """Counts the whole-index reads of this process: wraps the ``read_index`` the package's modules call."""

    def __init__(self) -> None:
        import importlib

        # By module name: ``celery_delayq.pending`` the attribute is the function, not the package.
        self.modules = [importlib.import_module(f"celery_delayq.{m}")
                        for m in ("pending.listing", "index.ids", "cancels.requests")]
        self.original = self.modules[0].read_index
        self.reads: list[tuple[float, float]] = []  # (started, seconds), time.monotonic()
        self._lock = threading.Lock()

        inside = threading.local()  # a read the reader process fell back to is counted once, as its call

        def counted(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("task_ids") or getattr(inside, "on", False):
                return self.original(*args, **kwargs)
            started = time.monotonic()
            try:
                return self.original(*args, **kwargs)
            finally:
                with self._lock:
                    self.reads.append((started, time.monotonic() - started))
        for m in self.modules:
            m.read_index = counted  # type: ignore[attr-defined]
        # The web page's kept list is read in a child process (pending.reader_process): its reads are the
        # reader's calls, timed here from the request to the last chunk unpickled.
        from celery_delayq.pending.reader_process import ReaderProcess

        self.reader_class, self.reader_call = ReaderProcess, ReaderProcess.__call__
        reader_call = self.reader_call

        def counted_call(reader: Any, app: Any) -> Any:
            started = time.monotonic()
            inside.on = True
            try:
                return reader_call(reader, app)
            finally:
                inside.on = False
                with self._lock:
                    self.reads.append((started, time.monotonic() - started))
        ReaderProcess.__call__ = counted_call  # type: ignore[method-assign]

    def between(self, start: float, end: float) -> list[tuple[float, float]]:
        with self._lock:
            return [r for r in self.reads if start <= r[0] < end]

    def restore(self) -> None:
        for m in self.modules:
            m.read_index = self.original  # type: ignore[attr-defined]
        self.reader_class.__call__ = self.reader_call  # type: ignore[method-assign]


def _live(asgi: Any, svc: Any, counter: IndexReads, probe: str, search: str, seconds: float,
          pollers: int) -> dict[str, Any]:
    """Pollers on ``/api/changes`` while clicks are timed (see the module docstring)."""
    from fastapi.testclient import TestClient

    from celery_delayq.web.live import POLL_S, SIGNAL_TTL

    stop = threading.Event()
    ages: list[float] = []
    polls: list[float] = []
    refetches = [0]
    lock = threading.Lock()

    def poller(k: int) -> None:
        with TestClient(asgi) as c:
            drawn = time.time()
            time.sleep(k * POLL_S / pollers)  # pages opened at different moments
            while not stop.is_set():
                t = time.perf_counter()
                sig = c.get("/api/changes").json()
                took = time.perf_counter() - t
                with lock:
                    polls.append(took)
                    if sig["read_at"] is not None:
                        ages.append(sig["now"] - sig["read_at"])
                if sig["changed_at"] > drawn:  # what delayq.js does: fetch the page again
                    c.get("/waiting")
                    drawn = time.time()
                    with lock:
                        refetches[0] += 1
                stop.wait(POLL_S)

    clicks: dict[str, list[tuple[float, float]]] = {  # (started, seconds), time.monotonic()
        "first page, API": [], "first page, HTML": [], "id lookup, API": [], "argument search, API": []}
    with TestClient(asgi) as c:
        # A fresh list and the signal (with the snapshot's live ttl) before the clock starts: the rows before
        # this leave the kept list tens of seconds old, which the first polls would otherwise report.
        svc.snapshot.invalidate()
        c.get("/api/changes")
        threads = [threading.Thread(target=poller, args=(k,), daemon=True) for k in range(pollers)]
        start = time.monotonic()
        for th in threads:
            th.start()
        end = start + seconds
        while time.monotonic() < end:
            for name, call in (("first page, API", lambda: c.get("/api/waiting", params={"limit": 50})),
                               ("first page, HTML", lambda: c.get("/waiting")),
                               ("id lookup, API", lambda: c.get(f"/api/waiting/{probe}")),
                               ("argument search, API", lambda: c.get("/api/waiting", params={"args": search}))):
                t = time.monotonic()
                r = call()
                clicks[name].append((t, time.monotonic() - t))
                assert r.status_code == 200, (name, r.status_code, r.text[:300])
            time.sleep(0.5)
        stop.set()
        for th in threads:
            th.join()
        finished = time.monotonic()
    reads = counter.between(start, finished)
    read_s = [s for _, s in reads]
    gaps = [b[0] - a[0] for a, b in zip(reads, reads[1:])]
    span = finished - start

    def overlaps(click: tuple[float, float]) -> bool:  # did a whole-index read run during the click?
        return any(r0 < click[0] + click[1] and click[0] < r0 + rs for r0, rs in counter.between(0, finished))

    def split(vs: list[tuple[float, float]], during: bool) -> dict[str, Any] | None:
        chosen = [v[1] * 1000 for v in vs if overlaps(v) == during]
        return _stats(chosen, 1) if chosen else None

    return {
        "seconds": round(span, 1), "pollers": pollers, "poll_s": POLL_S, "signal_ttl_s": SIGNAL_TTL,
        "polls": len(polls), "refetches": refetches[0],
        "clicks_ms": {k: _stats([v[1] * 1000 for v in vs], 1) for k, vs in clicks.items()},
        # The same clicks, those that overlapped a whole-index read (its child process; the parent unpickles its chunks) and the rest.
        "clicks_during_read_ms": {k: split(vs, True) for k, vs in clicks.items()},
        "clicks_between_reads_ms": {k: split(vs, False) for k, vs in clicks.items()},
        "poll_ms": _stats([v * 1000 for v in polls], 1),
        "signal_age_s": _stats(ages, 1),
        "index_reads": len(reads),
        "index_read_s": _stats(read_s, 2) if read_s else None,
        "index_read_every_s": round(statistics.median(gaps), 2) if gaps else None,
        "snapshot_ttl_s": round(svc.snapshot.ttl, 2),
        # One read per snapshot period: the list is re-read once it is ttl old, and the read takes read_s.
        "reads_expected": round(span / (svc.snapshot.ttl + statistics.median(read_s)), 1) if read_s else None,
        "host_load_1m_end": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--live-seconds", type=float, default=30.0)
    parser.add_argument("--pollers", type=int, default=5)
    parser.add_argument("--render", action="store_true", help="only write web.md again from web.json")
    opts = parser.parse_args()
    if opts.render:
        _write(json.loads((RESULTS_DIR / "web.json").read_text()))
        return

    from celery import Celery
    from fastapi.testclient import TestClient

    import celery_delayq
    from celery_delayq.glue.app_ladder import index_of
    from celery_delayq.index import read_cancel_book
    from celery_delayq.web import create_app

    broker = broker_version()
    results: dict[str, Any] = {"tasks": opts.tasks, "rounds": opts.rounds, "broker": broker,
                               "cpus": os.cpu_count(), "python": platform.python_version(),
                               "host_load_1m": round(os.getloadavg()[0], 1), "at": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                           time.gmtime())}
    counter = IndexReads()
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
        results["host_load_1m_measuring"] = round(os.getloadavg()[0], 1)
        asgi = create_app(app)
        client = TestClient(asgi)
        svc = asgi.state.delayq
        last = opts.tasks - 50

        def cold_api() -> Any:
            svc.snapshot.invalidate()
            return client.get("/api/waiting", params={"limit": 50})

        def cold_html() -> Any:
            svc.snapshot.invalidate()
            return client.get("/waiting")

        probe = ids[len(ids) // 2]
        search = f"customer-{opts.tasks - 1}'"
        rows: dict[str, Any] = {}
        t, r = _timed(cold_api, opts.rounds)
        assert r.status_code == 200 and r.json()["total"] == opts.tasks, r.text[:300]
        rows["first page, API, cold (whole index read)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/api/waiting", params={"limit": 50}), opts.rounds)
        rows["first page, API, warm (kept list, what a click gets)"] = (t, len(r.content))
        t, r = _timed(cold_html, opts.rounds)
        rows["first page, HTML, cold"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/waiting"), opts.rounds)
        rows["first page, HTML, warm"] = (t, len(r.content))
        t, r = _timed(lambda: client.get(f"/waiting?offset={opts.tasks // 2}"), opts.rounds)
        rows[f"page at offset {opts.tasks // 2:,}, HTML, warm"] = (t, len(r.content))
        t, r = _timed(lambda: client.get(f"/waiting?offset={last}"), opts.rounds)
        assert r.status_code == 200
        rows[f"last page (offset {last:,}), HTML, warm"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/api/waiting", params={"offset": last, "limit": 50}), opts.rounds)
        assert len(r.json()["items"]) == 50, r.text[:300]
        rows[f"last page (offset {last:,}), API, warm"] = (t, len(r.content))
        t, r = _timed(lambda: client.get(f"/api/waiting/{probe}"), opts.rounds)
        assert r.status_code == 200 and r.json()["task_id"] == probe, r.text[:300]
        rows["id lookup, API (one shard + cancel log)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/waiting", params={"id": probe}), opts.rounds)
        assert probe in r.text
        rows["id lookup, HTML (whole id)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get(f"/waiting/{probe}"), opts.rounds)
        assert r.status_code == 200 and probe in r.text
        rows["task detail page, HTML (one shard, its passes)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/api/waiting", params={"id": probe[:8]}), opts.rounds)
        assert r.json()["total"] >= 1
        rows["id prefix search, warm (kept list)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/api/waiting", params={"args": search}), opts.rounds)
        assert r.json()["total"] == 1, r.text[:300]
        rows["argument search, API, warm (kept list)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/waiting", params={"args": "customer-4242"}), opts.rounds)
        rows["argument search, HTML, warm"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/retries"), opts.rounds)
        assert r.status_code == 200
        rows["Retries page with its error groups, HTML, warm (kept list)"] = (t, len(r.content))
        t, r = _timed(lambda: client.get("/api/waiting/groups", params={"retries": "false"}), opts.rounds)
        assert r.status_code == 200, r.text[:300]
        rows[f"error groups of all {opts.tasks:,}, API, warm (kept list)"] = (t, len(r.content))
        t, _ = _timed(lambda: counter.original(*index_of(app)), opts.rounds)
        rows["part: read_index, all 16 shards"] = (t, 0)
        t, _ = _timed(lambda: counter.original(*index_of(app), task_ids=[probe]), opts.rounds)
        rows["part: read_index, one shard"] = (t, 0)
        t, _ = _timed(lambda: read_cancel_book(*index_of(app)), opts.rounds)
        rows["part: cancel log read"] = (t, 0)
        results["rows"] = {k: {"median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3), "bytes": b}
                           for k, (v, b) in rows.items()}
        if opts.live_seconds > 0:
            results["live"] = _live(asgi, svc, counter, probe, search, opts.live_seconds, opts.pollers)
        counter.restore()
        celery_delayq.uninstall(app)
    line = ".".join(broker.split(".")[:2])
    path = RESULTS_DIR / "web.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    if "lines" not in kept:  # the file of one line, before both were kept
        kept = {"lines": {}}
    kept["lines"][line] = results
    path.write_text(json.dumps(kept, indent=2) + "\n")
    _write(kept)


def _write(kept: dict[str, Any]) -> None:
    """``web.md`` from ``web.json``'s lines, keeping what follows its by-hand line."""
    text = render(kept["lines"])
    out = RESULTS_DIR / "web.md"
    old = out.read_text() if out.exists() else ""
    by_hand = old[old.index(HAND):] if HAND in old else HAND + "\n"
    out.write_text(text + "\n" + by_hand)
    print(text)


def render(lines: dict[str, dict[str, Any]]) -> str:
    """``web.md``'s tables, one section per broker line."""
    order = sorted(lines, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    first = lines[order[0]]
    out = [f"# delayq web at scale: {first['tasks']:,} tasks waiting", "",
           f"The ASGI app in process (no HTTP socket), the broker on loopback, {first['cpus']} cores shared with "
           f"other work, Python {first['python']}. Command: `.venv/bin/python -m benchmarks.web_scale --tasks "
           f"{first['tasks']} --rounds {first['rounds']}` (per broker: see the module docstring)."]
    for v in order:
        r = lines[v]
        out += ["", f"## RabbitMQ {r['broker']} ({r.get('at', '?')})", "",
                f"1-min load {r['host_load_1m']:.1f} at the start, {r.get('host_load_1m_measuring', float('nan')):.1f} "
                f"when the timing began; publishing the {r['tasks']:,} tasks took {r['publish_s']} s; "
                f"{r['rounds']} rounds per row, one after the other.", "",
                "| what | median s | max s | response bytes |", "|---|---:|---:|---:|"]
        for k, row in r["rows"].items():
            out.append(f"| {k} | {row['median_s']:.3f} | {row['max_s']:.3f} | {row['bytes']:,} |")
        lv = r.get("live")
        if lv:
            out += ["", f"### Live view: {lv['pollers']} pages polling `/api/changes` every {lv['poll_s']:g} s for "
                    f"{lv['seconds']:g} s, clicks timed meanwhile (1-min load {lv['host_load_1m_end']:.1f} at the end)",
                    "", "| what | n | median ms | p95 ms | max ms | while the index is read: n, median, max ms | "
                    "between reads: n, median, max ms |", "|---|---:|---:|---:|---:|---:|---:|"]

            def brief(split: str, k: str) -> str:
                if split not in lv:
                    return "not split"
                st = lv[split][k]
                return f"{st['n']}, {st['median']:.1f}, {st['max']:.1f}" if st else "0"
            for k, s in lv["clicks_ms"].items():
                out.append(f"| {k} | {s['n']} | {s['median']:.1f} | {s['p95']:.1f} | {s['max']:.1f} | "
                           f"{brief('clicks_during_read_ms', k)} | {brief('clicks_between_reads_ms', k)} |")
            s = lv["poll_ms"]
            out.append(f"| `/api/changes` (a poll) | {s['n']} | {s['median']:.1f} | {s['p95']:.1f} | {s['max']:.1f} | | |")
            a = lv["signal_age_s"]
            rs = lv["index_read_s"] or {"median": float("nan"), "max": float("nan")}
            every = f"one every {lv['index_read_every_s']} s median; " if lv["index_read_every_s"] else ""
            out += ["", f"* Age of the list behind the signal (`now - read_at`): median {a['median']:.1f} s, "
                    f"p95 {a['p95']:.1f} s, max {a['max']:.1f} s ({a['n']} polls).",
                    f"* Whole-index reads during the polling: **{lv['index_reads']}** in {lv['seconds']:g} s "
                    f"({every}each took {rs['median']:.2f} s median, {rs['max']:.2f} s max), for {lv['polls']} polls by {lv['pollers']} pages: about one per "
                    f"snapshot period (ttl {lv['snapshot_ttl_s']} s + the read: {lv['reads_expected']} expected), "
                    f"not one per page. Pages that fetched themselves again (the signal changed): {lv['refetches']}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
