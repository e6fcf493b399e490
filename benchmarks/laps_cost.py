"""What one extra lap costs a delay longer than the ladder, measured on a scaled-down ladder.

A ladder of 3 levels of radix 4 with a 10 ms unit holds 0.63 s, so a delay
of ``k * 0.63 + 0.3`` s makes ``k`` laps in seconds, exactly as a delay of
``k`` times 31 days does on the default ladder. For each ``k`` the same
number of messages is scheduled at once; a raw consumer records when each
arrives. The cost of a lap is the slope of the lateness over ``k`` (least
squares over the medians), in the same run. Each lap is put back against the
final due time, so the relay's own time does not add up from lap to lap:

    python benchmarks/laps_cost.py [--per-lap 50] [--max-laps 4]

The relay runs in this process (as a worker's bootstep would run it).
Writes ``benchmarks/results/laps.json``.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import amqp
import click
import kombu

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from celery_delayq.config import DelayqConfig  # noqa: E402
from celery_delayq.rabbitmq.laps import LapRelay  # noqa: E402
from celery_delayq.rabbitmq.publisher import LadderPublisher  # noqa: E402
from celery_delayq.index.writer import index_writer_for  # noqa: E402
from celery_delayq.scheduling import Scheduler  # noqa: E402

HOST = "127.0.0.1:5672"


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@click.command()
@click.option("--per-lap", default=50, show_default=True, help="Messages per lap count.")
@click.option("--max-laps", default=4, show_default=True, help="Largest number of laps measured.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=REPO / "benchmarks" / "results" / "laps.json", show_default=True)
def main(per_lap: int, max_laps: int, out: Path) -> None:
    """Lateness by number of laps, and the cost of one lap."""
    vhost = f"laps-{uuid.uuid4().hex[:6]}"
    _ctl("add_vhost", vhost)
    _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        url = f"amqp://guest:guest@{HOST}/{vhost}"
        config = DelayqConfig(prefix="laps", levels=3, radix=4, unit_ms=10)
        span = config.spec.max_delay_s
        publisher = LadderPublisher(kombu.Connection(url), config)
        scheduler = Scheduler(config, publisher, index=index_writer_for(publisher.template, config))
        conn = amqp.Connection(HOST, virtual_host=vhost)
        conn.connect()
        ch = conn.channel()
        ch.queue_declare("dest", durable=True, auto_delete=False)
        publisher.declare()
        relay = LapRelay(scheduler, kombu.Connection(url), config.spec.laps_queue)
        relay.start()
        arrivals: dict[str, float] = {}

        def on(m: amqp.Message) -> None:
            arrivals[m.headers["id"]] = time.time() - float(m.headers["x-delayq-due"])
            ch.basic_ack(m.delivery_tag)

        ch.basic_consume("dest", callback=on)
        laps_of: dict[str, int] = {}
        with scheduler.batch():
            for k in range(max_laps + 1):
                for i in range(per_lap):
                    task_id = f"{k}-{i}"
                    laps_of[task_id] = k
                    scheduler.schedule_body("x", delay=k * span + 0.3, queue="dest", headers={"id": task_id})
        deadline = time.time() + max_laps * span + 30
        while len(arrivals) < len(laps_of) and time.time() < deadline:
            try:
                conn.drain_events(timeout=0.5)
            except socket.timeout:
                pass
        relay.stop()
        rows = []
        for k in range(max_laps + 1):
            late = sorted(1000 * v for t, v in arrivals.items() if laps_of[t] == k)
            rows.append({"laps": k, "n": len(late), "early": sum(v < 0 for v in late),
                         "p50_ms": round(statistics.median(late), 1) if late else None,
                         "p99_ms": round(late[min(len(late) - 1, int(len(late) * 0.99))], 1) if late else None})
        xs = [r["laps"] for r in rows if r["p50_ms"] is not None]
        ys = [r["p50_ms"] for r in rows if r["p50_ms"] is not None]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
        doc = {"ladder": {"levels": 3, "radix": 4, "unit_ms": 10, "span_s": span}, "per_lap": per_lap,
               "rows": rows, "cost_per_lap_ms": round(slope, 1), "lost": len(laps_of) - len(arrivals)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        click.echo("| laps | messages | early | lateness p50 | p99 |\n|---:|---:|---:|---:|---:|")
        for r in rows:
            click.echo(f"| {r['laps']} | {r['n']} | {r['early']} | {r['p50_ms']} ms | {r['p99_ms']} ms |")
        click.echo(f"\ncost of one lap: {slope:.1f} ms (slope of the median); lost: {doc['lost']}")
        conn.close()
        publisher.close()
    finally:
        _ctl("delete_vhost", vhost)


if __name__ == "__main__":
    main()
