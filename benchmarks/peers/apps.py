"""Celery apps of the compared systems, shared by publishers and worker subprocesses.

One task, ``dqbench.record(due, seq)``, records when it started running; the
publisher side and the worker (``celery -A benchmarks.peers.workerapp``) build
the very same app from the same function, so what a worker consumes is
exactly what was published.

Systems:

* ``delayq``  - celery_delayq: task base ``DelayedRetryTask``, classic destination queue.
* ``native``  - Celery's native delayed delivery: the destination is a quorum queue behind a
  topic exchange (the only setup in which Celery activates it), ``confirm_publish`` on.
* ``classic`` - classic ETA: default direct exchange, classic queue, the worker holds the ETA.
* ``plain``   - no delay at all; used for Celery's unconfirmed ``send_task`` reference rate.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, Task
from kombu import Exchange, Queue

TASK_NAME = "dqbench.record"

QUEUES = {
    "delayq": "dqbench.delayq",
    "native": "dqbench.native",
    "classic": "dqbench.classic",
    "plain": "dqbench.plain",
    "plain_quorum": "dqbench.plain.quorum",
}


class _Recorder:
    """Appends ``seq due arrival hops`` lines to the worker's record file."""

    def __init__(self) -> None:
        self._fh: Any = None

    def write(self, seq: int, due: float, arrival: float, hops: Any) -> None:
        if self._fh is None:
            path = os.environ.get("DQB_RECORD")
            if not path:
                return
            self._fh = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the worker's life
        self._fh.write(f"{seq} {due!r} {arrival!r} {hops if hops is not None else -1}\n")


_RECORDER = _Recorder()


def native_queue() -> Queue:
    """The quorum destination queue behind a topic exchange that native delivery needs."""
    return Queue(QUEUES["native"], Exchange("dqbench.native.x", type="topic"), routing_key=QUEUES["native"],
                 queue_arguments={"x-queue-type": "quorum"})


_APPS: dict[tuple[Any, ...], tuple[Celery, Any]] = {}


def make_app(system: str, url: str, *, confirm: bool = False, prefetch: int = 64,
             delayq: dict[str, Any] | None = None) -> tuple[Celery, Any]:
    """``(app, record_task)`` for ``system`` on broker ``url``, one per process and settings.

    Cached because kombu's connection and producer pools are process-global
    and keyed by broker URL: a second app on the same URL shares them, so
    apps are kept alive rather than closed between benchmark jobs.

    Args:
        confirm: Celery's ``confirm_publish`` (each publish waits for its confirm).
        prefetch: ``worker_prefetch_multiplier``; high so a solo worker is never starved.
        delayq: ``delayq_*`` settings (without the prefix) for the delayq system.
    """
    key = (system, url, confirm, prefetch, tuple(sorted((delayq or {}).items())))
    if key not in _APPS:
        _APPS[key] = _build_app(system, url, confirm=confirm, prefetch=prefetch, delayq=delayq)
    return _APPS[key]


def _build_app(system: str, url: str, *, confirm: bool, prefetch: int,
               delayq: dict[str, Any] | None) -> tuple[Celery, Any]:
    app = Celery(f"dqbench_{system}", broker=url, set_as_current=False)
    conf: dict[str, Any] = {
        "broker_heartbeat": 0,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "worker_prefetch_multiplier": prefetch,
        "task_ignore_result": True,
        "task_default_queue": QUEUES[system],
        "worker_send_task_events": False,
        "task_send_sent_event": False,
    }
    if confirm:
        conf["broker_transport_options"] = {"confirm_publish": True}
    if system == "plain_quorum":  # Celery's own publish into a quorum queue: a ladder publish's confirm peer
        conf.update(task_queues=[Queue(QUEUES[system], queue_arguments={"x-queue-type": "quorum"})])
    if system == "native":
        q = native_queue()
        conf.update(task_queues=[q], task_default_exchange=q.exchange.name, task_default_exchange_type="topic",
                    task_default_routing_key=q.routing_key)
    base: type[Task] = Task
    if system == "delayq":
        from celery_delayq import DelayedRetryTask

        base = DelayedRetryTask
        for key, value in (delayq or {}).items():
            conf[f"delayq_{key}"] = value
    app.conf.update(conf)

    @app.task(name=TASK_NAME, base=base, bind=True, ignore_result=True)
    def record(self: Any, due: float, seq: int) -> None:
        arrival = time.time()
        _RECORDER.write(seq, due, arrival, getattr(self.request, "x-delayq-hops", None))

    return app, record


def app_from_env() -> Celery:
    """The app a worker subprocess runs: ``DQB_SYSTEM``, ``DQB_URL``, ``DQB_OPTS`` (JSON)."""
    opts = json.loads(os.environ.get("DQB_OPTS") or "{}")
    app, _task = make_app(os.environ["DQB_SYSTEM"], os.environ["DQB_URL"],
                          confirm=bool(opts.get("confirm")), prefetch=int(opts.get("prefetch", 64)),
                          delayq=opts.get("delayq"))
    return app
