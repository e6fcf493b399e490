"""Client CPU per delayed publish of one checkout, for A/B runs of two commits on the same broker.

The throughput scenario measures rates against peers; this measures what a
code change costs the publishing process itself: CPU time per call
(``time.process_time``, every thread of the process), which a busy broker or
machine disturbs far less than a rate. Best of ``--rounds`` rounds of ``N``
publishes (delay 600 s, so nothing dead-letters meanwhile). The ladder gets a
prefix of its own per checkout and is purged, not deleted, afterwards: on
RabbitMQ 3.x every quorum queue reserves file handles, and creating and
deleting ladders by the hundred is what wedged this machine's broker.

A/B against an older commit (its ``benchmarks.peers`` must exist), alternating::

    git worktree add /tmp/base 34e400d
    for i in 1 2 3; do
      (cd /tmp/base && PYTHONPATH=/tmp/base python /path/to/benchmarks/ab_publish.py apply_async_batch)
      python benchmarks/ab_publish.py apply_async_batch
    done

``--no-index`` turns the index of waiting tasks off (a feature with its own
cost scenario, ``index_cost``), to compare the publish path alone.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import time
from pathlib import Path

import click
import kombu

# This checkout's benchmarks package, after PYTHONPATH (which picks the checkout under test).
sys.path.append(str(Path(__file__).resolve().parents[1]))

MODES = ("apply_async", "apply_async_batch", "publish_batch", "schedule_batch")


@click.command()
@click.argument("mode", type=click.Choice(MODES))
@click.argument("n", type=int, default=3000)
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--no-index", is_flag=True, help="Turn the index of waiting tasks off (delayq_index = False).")
@click.option("--url", default="amqp://guest:guest@127.0.0.1:5672//", show_default=True)
def main(mode: str, n: int, rounds: int, no_index: bool, url: str) -> None:
    """Publish N delayed messages per round in MODE; print the best rate and CPU per call."""
    import celery_delayq
    from benchmarks.peers.delayq import DelayqPeer
    from benchmarks.scenarios import DEFAULT_LADDER

    checkout = os.path.dirname(os.path.dirname(os.path.abspath(celery_delayq.__file__)))
    prefix = "ab" + hashlib.sha1(f"{checkout}{no_index}".encode()).hexdigest()[:8]
    peer = DelayqPeer(url, **{**DEFAULT_LADDER, "prefix": prefix})
    if no_index and "index" in inspect.signature(celery_delayq.DelayqConfig).parameters:
        peer.settings["index"] = False  # (a checkout older than the index has none to turn off)
    peer.declare()
    publisher = peer.publisher(mode)
    due = time.time() + 600
    with publisher.batch():  # warm up: connection, declares, caches
        for i in range(200):
            publisher.send(due + i % 10, i)
    best_rate, best_cpu = 0.0, float("inf")
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        with publisher.batch():
            for i in range(n):
                publisher.send(due + i % 10, i)
        best_rate = max(best_rate, n / (time.perf_counter() - wall))
        best_cpu = min(best_cpu, (time.process_time() - cpu) / n * 1e6)
    publisher.close()
    with kombu.Connection(url) as conn:
        channel = conn.default_channel
        for queue in peer.queues():
            channel.queue_purge(queue)
    click.echo(f"{checkout} {mode}{' (no index)' if no_index else ''}: best {best_rate:,.0f}/s, "
               f"{best_cpu:.0f} µs CPU per call")


if __name__ == "__main__":
    main()
