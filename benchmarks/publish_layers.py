"""Where a confirmed delayed ``apply_async`` spends its time, layer by layer, beside Celery's own confirmed one.

    python benchmarks/publish_layers.py
    DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=.venv/rmq4-bin:$PATH python benchmarks/publish_layers.py

Each mode runs in a process of its own (``celery``: ``apply_async`` with ``confirm_publish`` into a quorum
queue; ``ladder``: ``apply_async(countdown=900)`` with celery_delayq, through the ladder; ``one_hop``:
``countdown=300`` repeated, its own queue), in a ``dqbench-layers-*`` vhost deleted afterwards. The process
wraps each layer's entry point with a ``perf_counter`` probe and reports the best of 5 rounds of 2,000 calls
(by the whole call's time): inclusive µs per call of every layer, so a layer's own time is its figure less the
next one's. It answers what publish_share.py's shares cannot: which part of a delayed publish costs more than
Celery's (issue #35, confirm each). Each probe adds well under a microsecond.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (REPO_ROOT as ROOT, RESULTS_DIR as RESULTS, broker_version,  # noqa: E402
                               script_argv, vhost, write_line_results)

MODES = {"celery": 0.0, "ladder": 900.0, "one_hop": 300.0}
#: (layer, what it is) in call order; ``celery`` measures the first, the Celery ones and the last.
LAYERS = (
    ("apply_async", "the whole call"),
    ("message", "Celery's task message (with celery_delayq's check)"),
    ("producer.publish", "the kombu producer's publish"),
    ("divert", "celery_delayq: is it delayed, where to"),
    ("scheduler.schedule", "celery_delayq: the scheduler"),
    ("publisher.place_on", "celery_delayq: route, headers, message"),
    ("send", "the frames sent"),
    ("confirm wait", "waiting for the broker's confirm"),
    ("send+confirm", "Celery: the frames sent and the confirm awaited"),
    ("index add", "celery_delayq: the index entry buffered"),
)

_CHILD = r'''
import collections, functools, json, sys, time
from celery import Celery
from kombu import Queue
mode, url, countdown = sys.argv[1], sys.argv[2], float(sys.argv[3])
spent = collections.Counter()

def probe(cls, name, layer):
    inner = getattr(cls, name)
    @functools.wraps(inner)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[layer] += time.perf_counter() - started
    setattr(cls, name, timed)

import celery.app.task
import kombu.messaging
probe(celery.app.task.Task, "apply_async", "apply_async")
app = Celery("layers", broker=url, set_as_current=False)
if mode == "celery":
    import amqp.channel
    probe(kombu.messaging.Producer, "publish", "producer.publish")
    probe(amqp.channel.Channel, "basic_publish_confirm", "send+confirm")
    app.conf.update(task_default_queue="layers-celery", broker_transport_options={"confirm_publish": True},
                    task_queues=[Queue("layers-celery", queue_arguments={"x-queue-type": "quorum"})])
else:
    import celery_delayq
    from celery_delayq.glue.app_ladder import AppLadder
    from celery_delayq.glue.message_check import CheckedTaskMessage
    from celery_delayq.glue.producer import LadderProducer
    from celery_delayq.index.writer import IndexWriter
    from celery_delayq.rabbitmq.confirms import ConfirmChannel
    from celery_delayq.rabbitmq.publisher import LadderPublisher
    from celery_delayq.scheduling import Scheduler
    for cls, name, layer in ((CheckedTaskMessage, "__call__", "message"), (LadderProducer, "publish", "producer.publish"),
                             (AppLadder, "divert", "divert"), (Scheduler, "schedule", "scheduler.schedule"),
                             (LadderPublisher, "place_on", "publisher.place_on"), (ConfirmChannel, "publish", "send"),
                             (ConfirmChannel, "wait", "confirm wait"), (IndexWriter, "add", "index add")):
        probe(cls, name, layer)
    app.conf.update(delayq_enabled=True, delayq_prefix="layers", task_default_queue="layers-" + mode)

@app.task(name="layers.noop")
def noop(x):
    return x

kw = {"countdown": countdown} if countdown else {}
for _ in range(300):  # connected, declared; a repeated countdown past its 100 calls
    noop.apply_async((1,), **kw)
best = None
for _ in range(5):
    spent.clear()
    for _ in range(2000):
        noop.apply_async((1,), **kw)
    per_call = {layer: round(s / 2000 * 1e6, 1) for layer, s in spent.items()}
    if best is None or per_call["apply_async"] < best["apply_async"]:
        best = per_call
print(json.dumps({"mode": mode, "layers": best}))
'''


def markdown(doc: dict[str, Any]) -> str:
    """The committed table (pure): inclusive µs per call of each layer, per mode; ``-`` where not on its path."""
    by_mode = {r["mode"]: r["layers"] for r in doc["runs"]}
    lines = [f"# A confirmed `apply_async`, layer by layer ({doc['broker']}, {doc['when']})", "",
             f"`{doc['argv']}`: each mode in a process of its own, best of 5 rounds of 2,000 calls; inclusive µs "
             "per call (a layer's own time is its figure less the next one's).", "",
             "| layer | what | " + " | ".join(by_mode) + " |", "|---|---|" + "---|" * len(by_mode)]
    for layer, what in LAYERS:
        cells = [f"{layers[layer]:,.1f}" if layer in layers else "-" for layers in by_mode.values()]
        if any(c != "-" for c in cells):
            lines.append(f"| {layer} | {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(out: Path) -> None:
    """Run each mode once; write publish_layers.md and .json under --out."""
    runs = []
    with vhost("layers") as vh:
        for mode, countdown in MODES.items():
            done = subprocess.run([sys.executable, "-c", _CHILD, mode, vh.url, str(countdown)],
                                  capture_output=True, text=True, timeout=600, cwd=ROOT)
            if done.returncode:
                raise click.ClickException(f"{mode} failed: {done.stderr[-2000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            click.echo(f"  {runs[-1]}", err=True)
    doc = {"when": time.strftime("%Y-%m-%d"), "broker": broker_version(), "argv":
           script_argv("benchmarks/publish_layers.py"), "runs": runs}
    write_line_results(out, "publish_layers", doc, markdown(doc))


if __name__ == "__main__":
    main()
