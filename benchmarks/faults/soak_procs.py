"""The chaos soak's own processes: the app every process imports, the publishers and the operator.

``python -m benchmarks.faults.soak_procs publisher|operator ...`` with the run's directory (holding
``soakapp.py``, written by :func:`write_app`) first on ``PYTHONPATH``. Every process appends JSON
lines to a file of its own under the ledger directory, after the fact it records:

- publishers (``pub-<i>-<pid>.jsonl``): ``sent`` before each ``apply_async`` (id, kind, due), then
  ``ok`` with the ids the broker confirmed (a single publish once it returned; a ``batch()`` once
  it ended), ``failed`` with ``PublishError.failed``/``entries``, or ``error`` (anything else: the
  ids may or may not be scheduled);
- the operator (``op-<pid>.jsonl``): each cancel (``celery_delayq.cancel``) and run-now (the CLI,
  ``delayq run-now``) of a waiting task, with its result: ``ok``, ``notfound`` (nothing recorded)
  or ``unknown`` (an error that leaves it open);
- the tasks themselves (``run-<worker>-<pid>.jsonl``, see :func:`write_app`): each run, with its
  attempt, worker, time, and the ladder pass's due time and entry from its headers.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["write_app", "publisher_main", "operator_main", "draw_task", "ladder_span"]


def ladder_span(levels: int, radix: int = 4, unit_ms: int = 10) -> float:
    """The longest wait of one pass through a ladder of this shape, in seconds."""
    return (radix ** levels - 1) * unit_ms / 1000.0


def write_app(workdir: Path, *, urls: list[str], mgmt_url: str, prefix: str, ledger: Path, levels: int) -> None:
    """``soakapp.py``: the app of every soak process, and its three tasks that record each run."""
    (workdir / "soakapp.py").write_text(textwrap.dedent(f"""
        import json, os, time
        from celery import Celery
        import celery_delayq  # noqa: F401 - the ladder turns on where the package is imported
        from celery_delayq import DelayedRetryTask

        app = Celery("soakapp", broker={";".join(urls)!r})
        app.conf.update(
            delayq_enabled=True, delayq_prefix={prefix!r}, delayq_management_url={mgmt_url!r},
            delayq_leader_placement="spread", delayq_levels={levels!r},
            task_default_queue={prefix + "-dest"!r}, task_default_queue_type="quorum",
            task_create_missing_queue_type="quorum", worker_detect_quorum_queues=True,
            broker_connection_retry_on_startup=True, broker_connection_max_retries=None,
            # At-least-once through a worker's kill -9: the message is acked after the task ran.
            task_acks_late=True, worker_hijack_root_logger=False,
        )
        LEDGER = {str(ledger)!r}
        WORKER = os.environ.get("SOAK_WORKER", "?")
        _out = []

        def record(task, kind, due):
            if not _out:
                _out.append(open(f"{{LEDGER}}/run-{{WORKER}}-{{os.getpid()}}.jsonl", "a", buffering=1))
            req = task.request
            _out[0].write(json.dumps({{
                "id": req.id, "kind": kind, "t": time.time(), "attempt": req.retries or 0, "worker": WORKER,
                "due": req.get("x-delayq-due"), "entry": req.get("x-delayq-entry"), "arg_due": due,
                "laps": req.get("x-delayq-laps")}}) + "\\n")

        class Flaky(Exception):
            pass

        @app.task(name="soak.plain", bind=True)
        def plain(self, kind, due):
            record(self, kind, due)

        # Celery's backoff without jitter: retry n waits 2 * 2**n s.
        @app.task(name="soak.flaky", bind=True, base=DelayedRetryTask, autoretry_for=(Flaky,), retry_backoff=2,
                  retry_jitter=False, max_retries=4)
        def flaky(self, kind, due, succeed_at):
            record(self, kind, due)
            if (self.request.retries or 0) < succeed_at:
                raise Flaky(f"attempt {{self.request.retries}} of {{succeed_at}}")

        @app.task(name="soak.doomed", bind=True, base=DelayedRetryTask, autoretry_for=(Flaky,), retry_backoff=1,
                  retry_jitter=False, max_retries=2)
        def doomed(self, kind, due):
            record(self, kind, due)
            raise Flaky("never succeeds: parked after its last retry")
    """))


#: Kinds of task a publisher sends, and their share: plain countdowns, retries that succeed, retries that
#: park, tasks the operator cancels or runs now, and laps (an eta beyond one pass of the ladder).
MIX = (("plain", 0.58), ("flaky", 0.17), ("doomed", 0.05), ("cancel", 0.10), ("runnow", 0.05), ("lap", 0.05))


def draw_task(rng: random.Random, *, now: float, top: float, span: float, last_due: float) -> tuple[str, float]:
    """One task's kind and countdown (pure): countdowns log-uniform from 0.5 s to ``top``, none due after ``last_due``."""
    r, acc, kind = rng.random(), 0.0, "plain"
    for name, share in MIX:
        acc += share
        if r < acc:
            kind = name
            break
    room = last_due - now
    if kind == "flaky":
        countdown = math.exp(rng.uniform(math.log(0.5), math.log(60.0)))
    elif kind == "doomed":
        countdown = math.exp(rng.uniform(math.log(0.5), math.log(30.0)))
    elif kind in ("cancel", "runnow"):
        countdown = rng.uniform(45.0, max(46.0, top))
    elif kind == "lap":
        countdown = rng.uniform(span * 1.05, span * 1.4)
    else:
        countdown = math.exp(rng.uniform(math.log(0.5), math.log(top)))
    if countdown > room:  # the load's tail: nothing due after the settle's start
        kind = "plain" if kind in ("cancel", "runnow", "lap") else kind
        countdown = max(0.5, min(countdown, room))
    return kind, countdown


class _Ledger:
    def __init__(self, path: Path) -> None:
        self.out: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def write(self, **row: Any) -> None:
        self.out.write(json.dumps(row) + "\n")


def publisher_main(index: int, ledger_dir: Path, end: float, rate: float, top: float, span: float, tail: float,
                   seed: int) -> None:
    """Publish the mix at ``rate`` tasks/s until ``end``: batches of 10-40 spread over their length, and singles."""
    import uuid

    import celery_delayq
    import soakapp  # type: ignore[import-not-found]

    tasks = {"plain": soakapp.plain, "cancel": soakapp.plain, "runnow": soakapp.plain, "lap": soakapp.plain,
             "flaky": soakapp.flaky, "doomed": soakapp.doomed}
    rng = random.Random(seed * 1000 + index * 7 + os.getpid())
    ledger = _Ledger(ledger_dir / f"pub-{index}-{os.getpid()}.jsonl")
    state = ledger_dir / f"pub-{index}.state"

    def say(what: str) -> None:
        state.write_text(what)

    def send(kind: str, countdown: float) -> str:
        task_id = str(uuid.uuid4())
        due = time.time() + countdown
        succeed_at = rng.randint(1, 3) if kind == "flaky" else None
        args: tuple[Any, ...] = (kind, due, succeed_at) if kind == "flaky" else (kind, due)
        ledger.write(ev="sent", id=task_id, kind=kind, due=due, t=time.time(), pub=index, succeed_at=succeed_at)
        tasks[kind].apply_async(args, countdown=countdown, task_id=task_id)
        return task_id

    while time.time() < end:
        in_batch = rng.random() < 0.7
        n = rng.randint(10, 40) if in_batch else rng.randint(1, 5)
        gap = 1.0 / rate
        ids: list[str] = []
        all_sent = False  # a PublishError after this came from the batch's end: it names every failure
        try:
            if in_batch:
                say("batch")
                with celery_delayq.batch(soakapp.app):
                    for _ in range(n):
                        ids.append(send(*draw_task(rng, now=time.time(), top=top, span=span, last_due=end + tail)))
                        time.sleep(gap)
                    all_sent = True
                say("idle")
                ledger.write(ev="ok", ids=ids, t=time.time())
            else:
                for _ in range(n):
                    ids = [send(*draw_task(rng, now=time.time(), top=top, span=span, last_due=end + tail))]
                    ledger.write(ev="ok", ids=ids, t=time.time())
                    time.sleep(gap)
        except celery_delayq.PublishError as exc:
            say("idle")
            failed = set(exc.failed)
            ledger.write(ev="failed", ids=exc.failed, entries=exc.entries, err=repr(exc)[:300], t=time.time())
            ok = [i for i in ids if i not in failed]
            if in_batch and all_sent and ok:
                ledger.write(ev="ok", ids=ok, t=time.time())  # the rest of the batch was confirmed
            else:
                ledger.write(ev="error", ids=ok, err="not confirmed: the publish raised", t=time.time())
            time.sleep(0.5)
        except Exception as exc:  # noqa: BLE001 - a connection lost with a node: may or may not be scheduled
            say("idle")
            ledger.write(ev="error", ids=ids, err=repr(exc)[:300], t=time.time())
            time.sleep(0.5)
    say("done")


def operator_main(ledger_dir: Path, end: float, workdir: Path, only: str) -> None:
    """Cancel every confirmed ``cancel`` task, or run every ``runnow`` task now (``only``), while they wait.

    One operator process per kind: a run-now through the CLI takes seconds on a loaded machine, and
    cancels must not wait behind them.
    """
    import celery_delayq
    import soakapp  # type: ignore[import-not-found]
    from celery_delayq import TaskIdNotFound

    ledger = _Ledger(ledger_dir / f"op-{only}-{os.getpid()}.jsonl")
    offsets: dict[Path, int] = {}
    kinds: dict[str, tuple[str, float]] = {}
    todo: dict[str, float] = {}  # task id -> when to try
    tries: dict[str, int] = {}
    while time.time() < end:
        for path in sorted(ledger_dir.glob("pub-*.jsonl")):
            with open(path) as f:
                f.seek(offsets.get(path, 0))
                while True:
                    line = f.readline()
                    if not line.endswith("\n"):
                        break
                    offsets[path] = f.tell()
                    row = json.loads(line)
                    if row["ev"] == "sent" and row["kind"] == only:
                        kinds[row["id"]] = (row["kind"], row["due"])
                    elif row["ev"] == "ok":
                        for i in row["ids"]:
                            if i in kinds:
                                todo[i] = row["t"] + 3.0  # the index entry is written with the next few
        now = time.time()
        for task_id, when in sorted(todo.items(), key=lambda kv: kv[1]):
            if when > now or time.time() >= end:
                continue
            kind, due = kinds[task_id]
            del todo[task_id]
            if due - time.time() < 20.0:
                ledger.write(ev=kind, id=task_id, res="skipped", t0=time.time(), t1=time.time(), err="too close to due")
                continue
            t0 = time.time()
            res, err = "ok", ""
            if kind == "cancel":
                try:
                    celery_delayq.cancel(soakapp.app, task_id)
                except TaskIdNotFound as exc:
                    res, err = "notfound", str(exc)[:300]
                except Exception as exc:  # noqa: BLE001 - may or may not be recorded
                    res, err = "unknown", repr(exc)[:300]
            else:
                try:
                    done = subprocess.run([sys.executable, "-m", "celery", "-A", "soakapp", "delayq", "run-now",
                                           task_id, "--yes", "--json"], capture_output=True, text=True,
                                          timeout=90, cwd=workdir)
                    if done.returncode != 0:
                        err = (done.stderr or done.stdout).strip()[-300:]
                        res = "notfound" if "not waiting" in err or "TaskIdNotFound" in err or "no waiting" in err \
                            else "unknown"
                except subprocess.TimeoutExpired:
                    res, err = "unknown", "run-now timed out"
            if res == "notfound" and tries.get(task_id, 0) < 3:  # the index may not list it yet: again in 5 s
                tries[task_id] = tries.get(task_id, 0) + 1
                todo[task_id] = time.time() + 5.0
                ledger.write(ev=kind + "-try", id=task_id, res=res, t0=t0, t1=time.time(), err=err)
                continue
            ledger.write(ev=kind, id=task_id, res=res, t0=t0, t1=time.time(), err=err)
        time.sleep(1.0)


def main(argv: list[str]) -> None:
    role = argv[0]
    if role == "publisher":
        index, ledger, end, rate, top, span, tail, seed = argv[1:9]
        publisher_main(int(index), Path(ledger), float(end), float(rate), float(top), float(span), float(tail),
                       int(seed))
    elif role == "operator":
        ledger, end, workdir, only = argv[1:5]
        operator_main(Path(ledger), float(end), Path(workdir), only)
    else:
        raise SystemExit(f"unknown role {role!r} (publisher or operator)")


if __name__ == "__main__":
    main(sys.argv[1:])
