"""Targets "confirms stay on in both paths" and "a nack must still reach the caller as an error".

A policy caps every ladder queue at ``max-length`` 0; the ladder queues are
declared with ``x-overflow: reject-publish``, so the broker nacks every
publish into them. Each delayq publish path then publishes three messages
and must raise :class:`celery_delayq.PublishError` (plain ``apply_async`` at
the call, the batched paths at block exit). A path that returns normally
would mean confirms were not awaited and the loss would be silent.
"""

from __future__ import annotations

import time
from typing import Any

from ..common import rabbitmqctl, vhost
from . import DEFAULT_LADDER, Ctx

NAME = "confirm_safety"
TITLE = "Nacks reach the caller"

PREFIX = "dqnack"


def job_nack(proto: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Child job: publish through every delayq mode into a ladder that nacks everything."""
    from celery_delayq import PublishError

    from ..peers import make_peer

    peer = make_peer("delayq", job["url"], **job["opts"])
    peer.declare()
    pubs = {mode: peer.publisher(mode) for mode in peer.modes}
    for pub in pubs.values():  # warm up (exit queue, connections) while publishes still succeed
        with pub.batch():
            pub.send(time.time() + 600, -1)
    rabbitmqctl("set_policy", "-p", job["vhost"], "--apply-to", "queues", "dqbench-nack",
                rf"^{PREFIX}\.", '{"max-length": 0}')
    time.sleep(1.5)  # let the policy reach the queues
    proto.ready()
    rows = []
    for mode, pub in pubs.items():
        raised: BaseException | None = None
        t0 = time.time()
        try:
            with pub.batch():
                for i in range(3):
                    pub.send(time.time() + 600, i)
        except PublishError as exc:
            raised = exc
        except Exception as exc:  # noqa: BLE001 - any other error is reported as-is
            raised = exc
        rows.append({"mode": mode, "raised": type(raised).__name__ if raised else None,
                     "is_publish_error": isinstance(raised, PublishError),
                     "message": str(raised)[:160] if raised else None, "seconds": round(time.time() - t0, 3)})
    rabbitmqctl("clear_policy", "-p", job["vhost"], "dqbench-nack")
    return {"rows": rows}


def run(ctx: Ctx) -> dict[str, Any]:
    with vhost("nack") as vh:
        job = {"kind": "call", "handler": "benchmarks.scenarios.confirm_safety:job_nack", "url": vh.url,
               "vhost": vh.name, "opts": dict(DEFAULT_LADDER, prefix=PREFIX)}
        res = ctx.pool.run([job], timeout=180)[0]
    for row in res["rows"]:
        ctx.log(f"  {row['mode']}: {row['raised'] or 'NO ERROR'}")
    res["all_raised"] = all(r["is_publish_error"] for r in res["rows"])
    return res
