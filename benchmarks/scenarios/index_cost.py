"""Issue 11: what the index of waiting tasks costs scheduling, and how fast it answers.

* **Cost.** Two ladders of the shipped shape in one vhost, one with the index
  (``delayq_index = True``: the publisher also appends an entry for every
  confirmed ladder message to one of 16 stream shards, see
  :mod:`celery_delayq.index.writer`) and one without. Durable delayed publishes through ``Scheduler.schedule``,
  one confirm at a time and pipelined in ``batch()``, in interleaved rounds
  (A B A B ...), delays 600-610 s so nothing moves while publishing. The
  kombu-level path is where a fixed per-message cost shows most; the ratio
  ``with index / without`` of the median rounds must stay >= 0.90.
* **Answers.** With the index filled by those publishes: a lookup by task id
  (one shard) and the full listing, timed, with the entries read per second.
  Full mode also fills one shard with the number of entries a shard holds
  when 1,000,000 tasks wait (62,500), one stream message each (tasks
  scheduled one at a time, the slowest to read), and times a lookup by id
  there: that is the 1M lookup, since a lookup reads exactly one shard.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from typing import Any

import amqp

from ..common import vhost
from . import DEFAULT_LADDER, Ctx

NAME = "index_cost"
TITLE = "Index of waiting tasks: scheduling cost and lookup time"

#: Interleaved rounds (A B, B A, ...): the machine is shared, one round proves little.
_ROUNDS = 6

_BODY = json.dumps([[42], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()


def _celery_headers(task_id: str, due: float, now: float) -> dict[str, Any]:
    """Headers of a Celery task message (protocol 2), as the ladder sees them."""
    return {"lang": "py", "task": "proj.tasks.charge", "id": task_id, "shadow": None,
            "eta": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(due)), "expires": None, "group": None,
            "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id, "parent_id": None,
            "argsrepr": "(42,)", "kwargsrepr": "{}", "origin": "gen1@bench", "ignore_result": False,
            "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {}}


def _publisher(url: str, prefix: str, index: bool) -> Any:
    import kombu

    from celery_delayq import DelayqConfig, LadderPublisher

    shape = {k: v for k, v in DEFAULT_LADDER.items() if k in ("radix", "unit_ms", "levels", "queue_type")}
    config = DelayqConfig(prefix=prefix, index=index, management_url="", **shape)
    pub = LadderPublisher(kombu.Connection(url), config)
    pub.declare(explicit=True)  # the API is off here: on RabbitMQ 3.x a new ladder must be created explicitly
    return pub


def _rate(pub: Any, queue: str, n: int, *, batched: bool, seconds: float) -> dict[str, Any]:
    """Publish up to ``n`` Celery-like delayed messages (stop after ``seconds``); messages/s."""
    import contextlib

    now = time.time()
    done = 0
    t0 = time.perf_counter()
    from celery_delayq import Scheduler
    from celery_delayq.index.writer import index_writer_for

    scheduler = Scheduler(pub.config, pub, index=index_writer_for(pub.template, pub.config))
    with scheduler.batch() if batched else contextlib.nullcontext():
        while done < n and time.perf_counter() - t0 < seconds:
            task_id = str(uuid.uuid4())
            due = now + 600 + (done % 1000) / 100
            scheduler.schedule(_BODY, due=due, delay=due - time.time(), exchange="", routing_key=queue,
                         headers=_celery_headers(task_id, due, now), content_type="application/json",
                         content_encoding="utf-8", queue_hint=queue)
            done += 1
    dt = time.perf_counter() - t0
    return {"n": done, "seconds": round(dt, 3), "rate": round(done / dt, 1)}


def _cost(ctx: Ctx, url: str, conn: amqp.Connection) -> dict[str, Any]:
    queue = "dqbench.index"
    conn.channel().queue_declare(queue, durable=True, auto_delete=False)
    pubs = {True: _publisher(url, "dqidx", True), False: _publisher(url, "dqnoidx", False)}
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {"schedule": {"index": [], "no_index": []},
                                                         "schedule_batch": {"index": [], "no_index": []}}
    n_each, n_batch = (1500, 6000) if ctx.quick else (5000, 30000)
    for index in (True, False):  # warm-up, not counted: first declares, connections, caches
        for batched in (False, True):
            _rate(pubs[index], queue, 300, batched=batched, seconds=5.0)
    conn.channel().queue_purge(queue)
    for rnd in range(_ROUNDS):
        order = (True, False) if rnd % 2 == 0 else (False, True)  # alternate who goes first
        for index in order:
            for mode, batched, n in (("schedule", False, n_each), ("schedule_batch", True, n_batch)):
                row = _rate(pubs[index], queue, n, batched=batched, seconds=ctx.cfg.tp_max_seconds)
                rounds[mode]["index" if index else "no_index"].append(row)
                ctx.log(f"  {mode} {'with' if index else 'without'} index, round {rnd + 1}: {row['rate']:.0f}/s")
        conn.channel().queue_purge(queue)
    out: dict[str, Any] = {}
    for mode, by in rounds.items():
        with_i = statistics.median(r["rate"] for r in by["index"])
        without = statistics.median(r["rate"] for r in by["no_index"])
        # Each round's two runs are adjacent in time: their ratio cancels most of the
        # other load on this shared machine, and the median of those ratios is the result.
        paired = [a["rate"] / b["rate"] for a, b in zip(by["index"], by["no_index"]) if b["rate"]]
        out[mode] = {"with_index": round(with_i, 1), "without_index": round(without, 1),
                     "ratio": round(statistics.median(paired), 3) if paired else None,
                     "round_ratios": [round(x, 3) for x in paired],
                     "rounds_with": [r["rate"] for r in by["index"]],
                     "rounds_without": [r["rate"] for r in by["no_index"]]}
    for pub in pubs.values():
        pub.close()
    return out


def _lookups(ctx: Ctx, url: str) -> dict[str, Any]:
    """Lookup by id and full listing on the index the cost rounds filled."""
    from celery import Celery

    from celery_delayq import pending
    from celery_delayq.glue.app_ladder import index_of
    from celery_delayq.index import read_index

    shape = {f"delayq_{k}": v for k, v in DEFAULT_LADDER.items() if k in ("radix", "unit_ms", "levels", "queue_type")}
    app = Celery("dqbench_index", broker=url, set_as_current=False)
    app.conf.update(delayq_prefix="dqidx", delayq_management_url="", broker_heartbeat=0, **shape)
    t0 = time.perf_counter()
    everything = read_index(*index_of(app))
    listing = time.perf_counter() - t0
    some = next(iter(everything), None)
    by_id = None
    if some is not None:
        t0 = time.perf_counter()
        found = pending(app, task_id=some)
        by_id = round(time.perf_counter() - t0, 3)
        assert [t.task_id for t in found] == [some], "the lookup by id did not find the task"
    return {"entries": len(everything), "list_s": round(listing, 3),
            "list_entries_per_s": round(len(everything) / listing, 1) if listing else None,
            "lookup_by_id_s": by_id}


def _one_shard(ctx: Ctx, vh: Any, entries: int) -> dict[str, Any]:
    """A shard holding ``entries`` Celery task entries (1,000,000 waiting / 16); time a lookup by id in it."""
    from celery import Celery

    from celery_delayq import pending
    from celery_delayq.rabbitmq.confirms import ConfirmChannel, Tracker
    from celery_delayq.glue.integration import ladder_for
    from celery_delayq.ladder.index_layout import IndexLayout
    from celery_delayq.index.writer import _messages

    shape = {f"delayq_{k}": v for k, v in DEFAULT_LADDER.items() if k in ("radix", "unit_ms", "levels", "queue_type")}
    app = Celery("dqbench_shard", broker=vh.url, set_as_current=False)
    app.conf.update(delayq_prefix="dqshard", delayq_management_url="", broker_heartbeat=0, **shape)
    ladder = ladder_for(app)
    ladder.publisher.declare()
    layout = IndexLayout(ladder.config.spec)
    conn = vh.connect()
    try:
        confirm = ConfirmChannel(conn)
        tracker = Tracker()
        now = time.time()
        target_shard = 3
        ids: list[str] = []
        t0 = time.perf_counter()
        while len(ids) < entries:
            task_id = str(uuid.uuid4())
            if layout.shard_of(task_id) != target_shard:
                continue
            due = now + 3600 + len(ids) * 0.01
            # The worst case: tasks scheduled one at a time, so one stream message per entry.
            entry = [task_id, "proj.tasks.charge", due, "", "q", "q", 0, uuid.uuid4().hex]
            [(queue, message)] = _messages(layout, [(task_id, entry)])
            confirm.publish(message, "", queue, tracker)
            ids.append(task_id)
            if len(confirm.pending) >= 2000:
                confirm.wait(timeout=60, keep=500)
        confirm.wait(tracker=tracker, timeout=120)  # every entry is in the shard before the lookup
        assert not tracker.take_failures()
        fill = time.perf_counter() - t0
    finally:
        conn.close()
    ctx.log(f"  filled one shard with {entries:,} entries in {fill:.0f} s")
    times = []
    for probe in (ids[len(ids) // 2], ids[-1]):
        t0 = time.perf_counter()
        found = pending(app, task_id=probe)
        times.append(round(time.perf_counter() - t0, 3))
        assert [t.task_id for t in found] == [probe]
    return {"entries_in_shard": entries, "equivalent_pending": entries * layout.shards,
            "lookup_by_id_s": times, "entries_per_s": round(entries / max(times), 1)}


def run(ctx: Ctx) -> dict[str, Any]:
    with vhost("index") as vh:
        conn = vh.connect()
        try:
            cost = _cost(ctx, vh.url, conn)
        finally:
            conn.close()
        lookups = _lookups(ctx, vh.url)
        ctx.log(f"  index: {lookups['entries']:,} entries listed in {lookups['list_s']} s, "
                f"lookup by id {lookups['lookup_by_id_s']} s")
        shard = None
        if not ctx.quick:
            shard = _one_shard(ctx, vh, 62_500)
            ctx.log(f"  1M-equivalent lookup by id: {shard['lookup_by_id_s']} s")
    return {"cost": cost, "lookups": lookups, "one_shard": shard,
            "statistic": f"median of the per-round ratios of {_ROUNDS} interleaved rounds (alternating which "
                         "goes first); rates are the medians of the rounds"}


def markdown(d: dict[str, Any]) -> str:
    """The report section."""
    rows = [f"Statistic: {d.get('statistic', '')}.", "",
            "| Path | With index /s | Without index /s | Ratio (>= 0.90) | Ratio per round |",
            "|---|---|---|---|---|"]
    for mode, r in d["cost"].items():
        rows.append(f"| LadderPublisher.{mode.replace('_batch', ' in batch()')} | {r['with_index']:,.0f} | "
                    f"{r['without_index']:,.0f} | {r['ratio']:.3f} | {r.get('round_ratios')} |")
    lk = d["lookups"]
    rows += ["", f"Index filled by these rounds: {lk['entries']:,} entries, listed in {lk['list_s']} s "
                 f"({lk['list_entries_per_s']:,.0f} entries/s); lookup by id {lk['lookup_by_id_s']} s."]
    if d.get("one_shard"):
        s = d["one_shard"]
        rows.append(f"One shard with {s['entries_in_shard']:,} entries (= {s['equivalent_pending']:,} waiting): "
                    f"lookup by id {s['lookup_by_id_s']} s ({s['entries_per_s']:,.0f} entries/s).")
    return "\n".join(rows)
