"""A ladder's first hop published to its queue by name (the ladder key in ``BCC``) against through its level's
topic exchange: what the broker saves at the publish, and what it pays at every later hop.

    python benchmarks/entry_by_queue.py
    DELAYQ_BENCH_BROKER_HOST=127.0.0.1:5673 PATH=.venv/rmq4-bin:$PATH python benchmarks/entry_by_queue.py

A lever of issue #35 measured and not shipped (docs/benchmarks.md, "A delayed apply_async beside Celery's
own"). RabbitMQ routes a message published to the default exchange by its queue's name without a topic match,
and a ``BCC`` key is routed too, kept for dead-lettering and taken off the message. But a dead-lettered message
keeps *every* routing key it was published with, so each later level's topic exchange (and the delivery
exchange) routes the queue's name as well as the ladder key. This measures both sides on a chain shaped like
the default ladder (14 levels of radix 4, its bindings), with py-amqp only (no celery_delayq code), in a
``dqbench-entry-*`` vhost deleted afterwards, the two entries alternating round by round:

* ``publish``: confirm each, into a level queue that holds the message (the wall time and the broker's CPU
  per publish: what a caller of ``apply_async`` waits for);
* ``N hops``: published without waiting for confirms, then dead-lettered through ``N`` level queues of 1 ms
  into a final queue; the broker's CPU per message from the first publish to the last arrival.
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

LEVELS = 14
ENTRIES = ("topic", "queue_bcc")
_QUORUM = {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
#: Celery's and the ladder's headers, as a task carries them (their size is part of what the broker decodes).
HEADERS: dict[str, Any] = {
    "lang": "py", "task": "bench.noop", "id": "0" * 36, "shadow": None, "eta": None, "expires": None,
    "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": "0" * 36,
    "parent_id": None, "argsrepr": "(1,)", "kwargsrepr": "{}", "origin": "gen1@host", "ignore_result": False,
    "x-delayq-due": 1.5, "x-delayq-delay": 900.0, "x-delayq-entry": "e" * 32, "x-delayq-hops": 7,
    "x-delayq-exchange": "", "x-delayq-routing-key": "celery", "x-delayq-format": 1}
BODY = b'[[1], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'


class Chain:
    """Levels ``hops``..1 of a 14x4 ladder (digit 1 waits ``ttl_ms``), dead-lettering into a final queue."""

    def __init__(self, ch: amqp.Channel, name: str, hops: int, ttl_ms: int) -> None:
        self.ch, self.final = ch, f"{name}.final"
        self.exchanges = [f"{name}.L{k:02d}" for k in range(hops + 1)]
        for x in self.exchanges:
            ch.exchange_declare(x, "topic", durable=True, auto_delete=False)
        for k in range(1, hops + 1):
            skip = "*." * (LEVELS - 1 - k)
            for d in (1, 2, 3):
                q = f"{name}.14x4.L{k:02d}.d{d}"
                ch.queue_declare(q, durable=True, auto_delete=False, arguments={
                    **_QUORUM, "x-message-ttl": ttl_ms, "x-dead-letter-exchange": self.exchanges[k - 1]})
                ch.queue_bind(q, self.exchanges[k], f"{skip}{d}.#")
            ch.exchange_bind(self.exchanges[k - 1], self.exchanges[k], f"{skip}0.#")
        ch.queue_declare(self.final, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
        ch.queue_bind(self.final, self.exchanges[0], "#")
        digits = ["0"] * LEVELS
        for k in range(1, hops + 1):
            digits[LEVELS - 1 - k] = "1"
        self.key = ".".join(digits) + ".c9f1a2b3c9f1a2b3"
        self.entry_queue, self.hops = f"{name}.14x4.L{hops:02d}.d1", hops

    def publisher(self, entry: str) -> Callable[[bool], None]:
        """``publish(confirm)`` of one message by ``entry`` (pure but for the channel)."""
        ch, key = self.ch, self.key

        def publish(confirm: bool) -> None:
            if entry == "topic":
                message = amqp.Message(BODY, delivery_mode=2, application_headers=dict(HEADERS))
                target = (self.exchanges[self.hops], key)
            else:
                message = amqp.Message(BODY, delivery_mode=2, application_headers={**HEADERS, "BCC": [key]})
                target = ("", self.entry_queue)
            (ch.basic_publish_confirm if confirm else ch.basic_publish)(message, *target, mandatory=True)

        return publish

    def depth(self, queue: str) -> int:
        return int(self.ch.queue_declare(queue, passive=True).message_count)


def per_message(before: float | None, after: float | None, n: int) -> float | None:
    """µs of broker CPU per message (``None``: the broker's process is not on this machine; pure)."""
    return None if before is None or after is None else (after - before) / n * 1e6


def measure_publish(chain: Chain, entry: str, n: int, pid: int | None) -> tuple[float, float | None]:
    """``(wall µs, broker CPU µs)`` per confirmed publish into ``chain``'s waiting entry queue (the broker: ``pid``)."""
    publish = chain.publisher(entry)
    cpu0, t0 = cpu_s_of(pid), time.perf_counter()
    for _ in range(n):
        publish(True)
    wall = (time.perf_counter() - t0) / n * 1e6
    return round(wall, 1), per_message(cpu0, cpu_s_of(pid), n)


def measure_hops(chain: Chain, entry: str, n: int, pid: int | None) -> float | None:
    """Broker CPU µs per message, from the first publish into ``chain`` to the last arrival in its final queue."""
    publish = chain.publisher(entry)
    chain.ch.queue_purge(chain.final)
    cpu0 = cpu_s_of(pid)
    for _ in range(n):
        publish(False)
    deadline = time.time() + 300
    while chain.depth(chain.final) < n:
        if time.time() > deadline:
            raise click.ClickException(f"{entry}: {chain.depth(chain.final)} of {n} arrived in 300 s")
        time.sleep(0.05)
    return per_message(cpu0, cpu_s_of(pid), n)


#: What each round measures: (table label, field of the run).
MEASURES = (("publish, confirm each: wall µs", "publish_wall"), ("publish, confirm each: broker CPU µs", "publish_cpu"),
            ("1 hop: broker CPU µs per message", "hop1"), ("4 hops: broker CPU µs per message", "hop4"))


def markdown(doc: dict[str, Any]) -> str:
    """The committed table (pure): medians over the rounds, and by-queue over topic."""
    lines = [f"# The first hop by queue name (`BCC`) or through the level's exchange ({doc['broker']}, {doc['when']})",
             "", f"`{doc['argv']}`: {doc['rounds']} rounds, the two entries alternating; medians.", "",
             "| measure | through the topic exchange | by queue name, key in `BCC` | by queue / topic |",
             "|---|---|---|---|"]
    for label, field in MEASURES:
        topic, bcc = (_median(doc["runs"][field][entry]) for entry in ENTRIES)
        ratio = f"{bcc / topic:.2f}" if topic and bcc else "-"
        lines.append(f"| {label} | {_cell(topic)} | {_cell(bcc)} | {ratio} |")
    return "\n".join(lines) + "\n"


def _median(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


@click.command()
@click.option("--rounds", default=5, show_default=True)
@click.option("--publishes", default=2000, show_default=True, help="Confirmed publishes per round and entry.")
@click.option("--messages", default=3000, show_default=True, help="Messages through the hops per round and entry.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(rounds: int, publishes: int, messages: int, out: Path) -> None:
    """Alternate the two entries; write entry_by_queue.md and .json under --out."""
    runs: dict[str, dict[str, list[float | None]]] = {field: {e: [] for e in ENTRIES} for _label, field in MEASURES}
    pid = broker_pid()  # asked once: rabbitmqctl's own work on the node stays out of every measurement
    with vhost("entry") as vh:
        conn = vh.connect()
        ch = conn.channel()
        ch.confirm_select()
        waiting = Chain(ch, "wait", 3, 3_600_000)
        one, four = Chain(ch, "one", 1, 1), Chain(ch, "four", 4, 1)
        for _ in range(rounds):
            for entry in ENTRIES:
                wall, cpu = measure_publish(waiting, entry, publishes, pid)
                measured = {"publish_wall": wall, "publish_cpu": cpu, "hop1": measure_hops(one, entry, messages, pid),
                            "hop4": measure_hops(four, entry, messages, pid)}
                for field, value in measured.items():
                    runs[field][entry].append(value)
                click.echo(f"  {entry}: {measured}", err=True)
            ch.queue_purge(waiting.entry_queue)
        conn.close()
    doc = {"when": time.strftime("%Y-%m-%d"), "broker": broker_version(), "rounds": rounds,
           "argv": script_argv("benchmarks/entry_by_queue.py"), "runs": runs}
    write_line_results(out, "entry_by_queue", doc, markdown(doc))


if __name__ == "__main__":
    main()
