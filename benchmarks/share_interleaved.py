"""A confirmed delayed ``apply_async`` beside Celery's own, interleaved in one process: the share without the drift.

    python benchmarks/share_interleaved.py
    DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=.venv/rmq4-bin:$PATH python benchmarks/share_interleaved.py

``publish_share.py`` runs each mode in a process of its own, as users deploy, one mode after the other: on a
shared machine the minutes between two modes move the wall times by more than the difference measured (its
per-alternation shares swing by 0.1 and more). Here every mode lives in one process and the modes alternate in
runs of ``--batch`` calls, ``--rounds`` times, so a slow minute falls on all of them alike; the share is the
sum of Celery's times over the sum of the mode's. Two Celery apps on one broker, in a ``dqbench-inter-*`` vhost
deleted afterwards:

* ``celery_confirmed``: Celery's ``apply_async``, no delay, ``confirm_publish`` into a quorum queue;
* ``celery_countdown_confirmed``: the same with ``countdown=900`` (classic ETA);
* ``delayq``: ``apply_async(countdown=900)`` through the ladder, confirm each;
* ``delayq_repeat``: ``apply_async(countdown=300)``, a countdown the process repeats: its one-hop queue;
* ``delayq_noindex``: ``delayq`` in a third app with ``delayq_index = False`` (what the index entry costs);
* ``delayq_topic_entry``: ``delayq`` in a fourth app (a ladder of its own) that enters the ladder through the
  level's topic exchange, as 1.0.0rc1 did, instead of the first queue's entry exchange (what the entry saves).

Per mode: the median wall µs per call over the rounds, the calling thread's CPU µs per call (``thread_time``),
and the share of ``celery_confirmed`` (and of the same-countdown peer).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (RESULTS_DIR as RESULTS, broker_version, script_argv, vhost,  # noqa: E402
                               write_line_results)

MODES = ("celery_confirmed", "celery_countdown_confirmed", "delayq", "delayq_repeat", "delayq_noindex",
         "delayq_topic_entry")
#: ``(mode, peer, what)`` of the shares the table gives.
SHARES = (("delayq", "celery_confirmed", "ladder, confirm each / Celery's `confirm_publish`"),
          ("delayq_repeat", "celery_confirmed", "a repeated countdown (one hop) / Celery's `confirm_publish`"),
          ("delayq", "celery_countdown_confirmed",
           "ladder, confirm each / Celery's `confirm_publish` with the same countdown"),
          ("delayq", "delayq_noindex", "ladder with the index of waiting tasks / without it (`delayq_index = False`)"),
          ("delayq_topic_entry", "celery_confirmed",
           "ladder entered through the level's topic exchange (1.0.0rc1) / Celery's `confirm_publish`"),
          ("delayq", "delayq_topic_entry",
           "ladder through the queue's entry exchange / through the level's topic exchange (1.0.0rc1)"))


def callers(url: str, countdown: float, repeat_countdown: float) -> dict[str, Callable[[], Any]]:
    """``mode -> one apply_async call`` on two apps of the broker at ``url``."""
    from celery import Celery
    from kombu import Queue

    import celery_delayq  # the setting below turns it on for ``ours`` only

    plain = Celery("inter_plain", broker=url, set_as_current=False)
    plain.conf.update(task_default_queue="inter-celery",
                      task_queues=[Queue("inter-celery", queue_arguments={"x-queue-type": "quorum"})],
                      broker_transport_options={"confirm_publish": True})
    ours = Celery("inter_ours", broker=url, set_as_current=False)
    ours.conf.update(delayq_enabled=True, delayq_prefix="inter", task_default_queue="inter-ours")
    unindexed = Celery("inter_unindexed", broker=url, set_as_current=False)
    unindexed.conf.update(delayq_enabled=True, delayq_prefix="inter", task_default_queue="inter-ours",
                          delayq_index=False)

    topic = Celery("inter_topic", broker=url, set_as_current=False)
    topic.conf.update(delayq_enabled=True, delayq_prefix="intertopic", task_default_queue="inter-ours")

    @plain.task(name="inter.plain")
    def plain_noop(x: int) -> int:
        return x

    @ours.task(name="inter.ours")
    def ours_noop(x: int) -> int:
        return x

    @unindexed.task(name="inter.unindexed")
    def unindexed_noop(x: int) -> int:
        return x

    @topic.task(name="inter.topic")
    def topic_noop(x: int) -> int:
        return x

    topic_noop.apply_async((1,), countdown=countdown)  # installs and declares its ladder
    publisher = celery_delayq.install(topic).publisher
    publisher.spec = dataclasses.replace(publisher.spec, entries="topic")

    return {"celery_confirmed": lambda: plain_noop.apply_async((1,)),
            "celery_countdown_confirmed": lambda: plain_noop.apply_async((1,), countdown=countdown),
            "delayq": lambda: ours_noop.apply_async((1,), countdown=countdown),
            "delayq_repeat": lambda: ours_noop.apply_async((1,), countdown=repeat_countdown),
            "delayq_noindex": lambda: unindexed_noop.apply_async((1,), countdown=countdown),
            "delayq_topic_entry": lambda: topic_noop.apply_async((1,), countdown=countdown)}


def sum_share(mine: list[float], peer: list[float]) -> float:
    """The peer's total time over the mode's, over the same rounds (pure)."""
    return sum(peer) / sum(mine)


def markdown(doc: dict[str, Any]) -> str:
    """The committed table (pure): the modes and shares the run has (an earlier run lacks ``delayq_noindex``)."""
    runs = doc["runs"]
    lines = [f"# A confirmed `apply_async`, the modes interleaved in one process ({doc['broker']}, {doc['when']})", "",
             f"`{doc['argv']}`: {doc['rounds']} rounds of {doc['batch']} calls per mode, the modes alternating in "
             f"one process (countdowns {doc['countdown']:g} s and, repeated, {doc['repeat_countdown']:g} s).", "",
             "| mode | median wall µs/call | calling thread's CPU µs/call |", "|---|---|---|"]
    for mode in (m for m in MODES if m in runs):
        lines.append(f"| {mode} | {statistics.median(runs[mode]['wall']):,.1f} | "
                     f"{statistics.median(runs[mode]['cpu']):,.1f} |")
    lines += ["", "Shares (the peer's summed wall time over the mode's, same rounds):", ""]
    for mode, peer, what in ((m, p, w) for m, p, w in SHARES if m in runs and p in runs):
        lines.append(f"- {what}: **{sum_share(runs[mode]['wall'], runs[peer]['wall']):.2f}** "
                     f"(calling thread's CPU: {sum_share(runs[mode]['cpu'], runs[peer]['cpu']):.2f})")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--rounds", default=40, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=200, show_default=True, type=click.IntRange(min=1), help="Calls per mode and round.")
@click.option("--countdown", default=900.0, show_default=True, help="Beyond delayq_bucket_max_delay: the ladder.")
@click.option("--repeat-countdown", default=300.0, show_default=True,
              help="Under delayq_bucket_max_delay, repeated: its one-hop queue after the warm-up.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(rounds: int, batch: int, countdown: float, repeat_countdown: float, out: Path) -> None:
    """Alternate the modes in one process; write share_interleaved.md and .json under --out."""
    runs: dict[str, dict[str, list[float]]] = {m: {"wall": [], "cpu": []} for m in MODES}
    with vhost("inter") as vh:
        call = callers(vh.url, countdown, repeat_countdown)
        for mode in MODES:  # warm-up: connections, declarations, the repeated countdown's one-hop queue
            for _ in range(max(batch, 200)):
                call[mode]()
        for _ in range(rounds):
            for mode in MODES:
                one = call[mode]
                c0, t0 = time.thread_time(), time.perf_counter()
                for _ in range(batch):
                    one()
                runs[mode]["wall"].append(round((time.perf_counter() - t0) / batch * 1e6, 1))
                runs[mode]["cpu"].append(round((time.thread_time() - c0) / batch * 1e6, 1))
    doc = {"when": time.strftime("%Y-%m-%d"), "broker": broker_version(), "rounds": rounds, "batch": batch,
           "countdown": countdown, "repeat_countdown": repeat_countdown,
           "argv": script_argv("benchmarks/share_interleaved.py"), "runs": runs}
    write_line_results(out, "share_interleaved", doc, markdown(doc))


if __name__ == "__main__":
    main()
