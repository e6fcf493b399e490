"""The broker's side of a confirmed publish, from Celery's to the ladder's, one difference at a time.

    python benchmarks/confirm_path.py
    DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=.venv/rmq4-bin:$PATH python benchmarks/confirm_path.py

Issue #35 asks a confirmed delayed ``apply_async`` for 0.95 of Celery's own ``confirm_publish``. The client's
own work is measured by ``publish_share.py --instructions``; this measures what the broker adds, with py-amqp
only (no Celery, no celery_delayq code), one connection and one confirm channel, in a ``dqbench-path-*`` vhost
deleted afterwards. Each path adds one difference to the one before it:

* ``celery``: Celery's task headers, a direct exchange, a quorum queue (what ``celery_confirmed`` publishes);
* ``headers``: plus the ladder's seven headers (due, delay, entry, hops, exchange, routing key, format);
* ``mandatory``: plus ``mandatory`` (every ladder publish has it: an unroutable one comes back, named);
* ``level_queue``: into a queue with a ladder level's arguments (a TTL, a dead-letter exchange, at-least-once
  dead-lettering, ``reject-publish``) instead of a plain quorum queue;
* ``ladder``: through a level's topic exchange with the ladder's 15-word key and bindings (the entry of a
  900 s countdown on the default 14x4 ladder): the ladder's publish up to 1.0.0rc1;
* ``fanout``: the same message, key and level queue, through a fanout exchange bound to that queue alone: the
  key is not matched but kept, so the later hops route it as before (the ladder's entry after 1.0.0rc1).

The paths alternate in short runs (``--batch`` publishes each, ``--rounds`` times), so the machine's drift
falls on all of them alike; every queue is purged after each round. Per path: the median wall time per
confirmed publish over the rounds, and the broker's CPU per publish over all of them (``/proc`` of the node).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import amqp
import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (RESULTS_DIR as RESULTS, broker_pid, broker_version, cpu_s_of,  # noqa: E402
                               script_argv, vhost, write_line_results)
from benchmarks.entry_by_queue import BODY, HEADERS, LEVELS, _QUORUM  # noqa: E402

#: Each path and the difference it adds to the one before it (module docstring), in order.
PATHS = {"celery": "Celery's headers, direct exchange, quorum queue", "headers": "the ladder's 7 headers",
         "mandatory": "`mandatory`", "level_queue": "a level queue's arguments (TTL, dead-lettering)",
         "ladder": "the level's topic exchange, 15-word key",
         "fanout": "instead, the queue's own fanout exchange (key kept)"}
CELERY_HEADERS = {k: v for k, v in HEADERS.items() if not k.startswith("x-delayq")}


def queues_of(name: str) -> list[str]:
    """The queues :func:`declare_paths` declares: the plain quorum queue, then level 7's digits 1–3 (pure)."""
    return [f"{name}.plain"] + [f"{name}.14x4.L07.d{d}" for d in (1, 2, 3)]


def declare_paths(ch: amqp.Channel, name: str) -> dict[str, Callable[[], None]]:
    """Declare every path's exchange and queue; return ``path -> publish one message and await its confirm``."""
    plain, *levels = queues_of(name)
    level = levels[0]  # digit 1 of level 7: where a 900 s countdown's first hop waits
    exchanges = ((plain, "direct"), (f"{name}.direct", "direct"), (f"{name}.L07", "topic"), (f"{name}.L06", "topic"),
                 (f"{name}.L07.d1.in", "fanout"))
    for x, kind in exchanges:
        ch.exchange_declare(x, kind, durable=True, auto_delete=False)
    ch.queue_declare(plain, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
    ch.queue_bind(plain, plain, plain)
    skip = "*." * (LEVELS - 1 - 7)
    for d, queue in enumerate(levels, start=1):  # level 7's queues and bindings, as the ladder has them
        ch.queue_declare(queue, durable=True, auto_delete=False,
                         arguments={**_QUORUM, "x-message-ttl": 3_600_000, "x-dead-letter-exchange": f"{name}.L06"})
        ch.queue_bind(queue, f"{name}.L07", f"{skip}{d}.#")
    ch.queue_bind(level, f"{name}.direct", level)
    ch.queue_bind(level, f"{name}.L07.d1.in", "")
    ch.exchange_bind(f"{name}.L06", f"{name}.L07", f"{skip}0.#")
    key = ".".join(["0"] * 6 + ["1"] + ["0"] * 7) + ".c9f1a2b3c9f1a2b3"  # a 900 s countdown's first hop
    targets: dict[str, tuple[dict[str, Any], str, str, bool]] = {
        "celery": (CELERY_HEADERS, plain, plain, False),
        "headers": (HEADERS, plain, plain, False),
        "mandatory": (HEADERS, plain, plain, True),
        "level_queue": (HEADERS, f"{name}.direct", level, True),
        "ladder": (HEADERS, f"{name}.L07", key, True),
        "fanout": (HEADERS, f"{name}.L07.d1.in", key, True),
    }

    def publisher(headers: dict[str, Any], exchange: str, routing_key: str, mandatory: bool) -> Callable[[], None]:
        def publish() -> None:
            message = amqp.Message(BODY, delivery_mode=2, application_headers=dict(headers))
            ch.basic_publish_confirm(message, exchange, routing_key, mandatory=mandatory)
        return publish

    return {path: publisher(*target) for path, target in targets.items()}




def markdown(doc: dict[str, Any]) -> str:
    """The committed table (pure): each path's median wall and broker CPU, and each step's share of the one
    before (for ``fanout``: of ``ladder``, the entry it replaces) and of ``celery``."""
    runs = doc["runs"]
    lines = [f"# A confirmed publish on the broker, from Celery's to the ladder's ({doc['broker']}, {doc['when']})",
             "", f"`{doc['argv']}`: {doc['rounds']} rounds of {doc['batch']} confirmed publishes per path, the paths "
             "alternating; the median wall µs per publish over the rounds, the broker's CPU µs per publish over "
             "all of them.", "",
             "| path | adds | wall µs | broker CPU µs | celery / this path (wall) | previous / this path (wall) |",
             "|---|---|---|---|---|---|"]
    base, previous = statistics.median(runs["celery"]["wall"]), None
    for path, adds in ((p, a) for p, a in PATHS.items() if p in runs):  # a run before 1.0.0 has no fanout
        wall = statistics.median(runs[path]["wall"])
        cpu = runs[path]["broker_cpu"]
        lines.append(f"| {path} | {adds} | {wall:,.0f} | {'-' if cpu is None else f'{cpu:,.0f}'} | "
                     f"{base / wall:.2f} | {'-' if previous is None else f'{previous / wall:.2f}'} |")
        previous = wall
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--rounds", default=40, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=200, show_default=True, type=click.IntRange(min=1),
              help="Confirmed publishes per path and round.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(rounds: int, batch: int, out: Path) -> None:
    """Alternate the paths; write confirm_path.md and .json under --out."""
    walls: dict[str, list[float]] = {p: [] for p in PATHS}
    cpu: dict[str, float] = {p: 0.0 for p in PATHS}
    pid = broker_pid()
    with vhost("path") as vh:
        conn = vh.connect()
        ch = conn.channel()
        ch.confirm_select()
        publish = declare_paths(ch, "path")
        for path in PATHS:  # warm-up
            for _ in range(batch):
                publish[path]()
        for _ in range(rounds):
            for path in PATHS:
                c0, t0 = cpu_s_of(pid), time.perf_counter()
                for _ in range(batch):
                    publish[path]()
                walls[path].append((time.perf_counter() - t0) / batch * 1e6)
                c1 = cpu_s_of(pid)
                if c0 is not None and c1 is not None:
                    cpu[path] += c1 - c0
            for q in queues_of("path"):
                ch.queue_purge(q)
        conn.close()
    total = rounds * batch
    runs = {p: {"wall": [round(w, 1) for w in walls[p]],
                "broker_cpu": None if pid is None else round(cpu[p] / total * 1e6, 1)} for p in PATHS}
    for p in PATHS:
        click.echo(f"  {p}: wall {statistics.median(walls[p]):.1f} µs, broker {runs[p]['broker_cpu']} µs", err=True)
    doc = {"when": time.strftime("%Y-%m-%d"), "broker": broker_version(), "rounds": rounds, "batch": batch,
           "argv": script_argv("benchmarks/confirm_path.py"), "runs": runs}
    write_line_results(out, "confirm_path", doc, markdown(doc))


if __name__ == "__main__":
    main()
