"""A worker whose cancel-log follower is behind still drops what was cancelled (real broker, real worker).

The chaos soak (``benchmarks/faults/soak.py``, RabbitMQ 4.3, seed 549762) saw a run-now run twice: during a
partition the old pass reached a worker 33-60 s after its pass cancel was confirmed, while that worker's
follower read a stream replica the partition had cut off. Every cancel due within the hour is now also
broadcast as Celery's ``revoke`` (:func:`celery_delayq.cancels.revoke.tell_workers`). Here the worker's
follower is stopped outright, so only the broadcast can tell it.
"""

from __future__ import annotations

import time
from typing import Any

from celery_delayq import cancel, pending
from celery_delayq.cancels.reschedule import reschedule
from celery_delayq.cancels.revoke import TOLD_WITHIN_S, tell_workers
from celery_delayq.cancels.worker import follower_for
from helpers import Collector, running_worker

#: Seconds the tasks wait: long enough that a loaded machine still finds them waiting when it acts.
DUE_IN = 15.0


def _wait_listed(app: Any, ids: list[str], timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not set(ids) <= {t.task_id for t in pending(app, task=f"{app.main}.*")}:
        assert time.time() < deadline, "the tasks were never listed as waiting"
        time.sleep(0.2)


def test_a_worker_whose_follower_reads_nothing_drops_a_cancel_and_a_superseded_pass(
        make_app, collector: Collector) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.job")
    def job(tag: str) -> None:
        collector.add(tag=tag, at=time.time())

    with running_worker(app):
        follower = follower_for(app)
        assert follower is not None
        follower.stop()  # behind for good: no cancel written from now on reaches the worker through the log
        moved, doomed, kept = (job.apply_async((tag,), countdown=DUE_IN) for tag in ("moved", "doomed", "kept"))
        due = time.time() + DUE_IN
        _wait_listed(app, [moved.id, doomed.id, kept.id], timeout=DUE_IN - 5)
        reschedule(app, moved.id, due=None)  # runs now; the old pass must not run at its due time
        cancel(app, doomed.id)
        assert not follower.book.pass_cancelled(pending(app, task_id=kept.id)[0].entry)
        collector.wait_for(2, timeout=30)
        time.sleep(max(0.0, due - time.time()) + 4.0)  # past the old copies' due time
    tags = sorted(r["tag"] for r in collector.items)
    assert tags == ["kept", "moved"], f"ran: {tags}"


def test_only_cancels_due_within_the_hour_are_broadcast(make_app) -> None:
    """Celery's workers keep a revoked id 3 hours: a later cancel is the log's alone (it would be forgotten)."""
    assert TOLD_WITHIN_S <= 3 * 3600 / 2
    app = make_app(delayq_enabled=True)
    assert tell_workers(app, [], timeout=5.0)  # nothing to say: no broadcast, no connection
    sent: list[Any] = []
    app.control.broadcast = lambda command, arguments=None, **kw: sent.append((command, arguments))
    now = time.time()
    assert tell_workers(app, [("later", now + 60), ("too-late", now + TOLD_WITHIN_S + 1), ("unknown", None),
                              ("soon", now + 1)], timeout=5.0, now=now)
    assert sent == [("revoke", {"task_id": ["unknown", "soon", "later"], "terminate": False, "signal": None})]
    sent.clear()
    assert tell_workers(app, [("too-late", now + TOLD_WITHIN_S + 1)], timeout=5.0, now=now) and not sent
