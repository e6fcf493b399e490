"""Changing the ladder's shape while tasks wait in the old one (real broker, real worker).

An app runs a 6x4 ladder; tasks wait in it, one is cancelled there. The app is reconfigured to
5x8 with ``delayq_previous_shapes = ["6x4"]`` and its worker restarted: tasks published before
wait out their time in the old ladder, new ones take the new one. ``pending`` lists both, ``cancel``
finds a task of the old ladder, the new worker honours a cancel made before the change, ``status``
says what still waits in the old ladder, and once it drained ``delayq topology delete --shape 6x4`` removes it (and only it) in one
command; it refuses while tasks still wait there.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any, Iterator

import amqp
import pytest

from celery_delayq import cancel, pending
from celery_delayq.ladder.spec import LadderSpec
from cli_helpers import broker_names, run_delayq
from helpers import BROKER_HOST, Collector, delete_ladder, management_url, running_worker


@pytest.fixture
def shapes(make_app: Any, uid: str, vhost: str, collector: Collector) -> Iterator[tuple[Any, Any]]:
    common = {"delayq_enabled": True, "delayq_prefix": f"sh{uid}", "delayq_unit_ms": 100,
              "delayq_management_url": management_url()}
    apps = (make_app(delayq_levels=6, **common),
            make_app(delayq_levels=5, delayq_radix=8, delayq_previous_shapes=["6x4"], **common))
    for app in apps:
        @app.task(name="proj.job", bind=True)
        def job(self: Any, tag: str) -> None:
            collector.add(tag=tag, at=time.time(), id=self.request.id)
    yield apps
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        for levels, radix in ((6, 4), (5, 8)):
            with contextlib.suppress(Exception):
                delete_ladder(conn, LadderSpec(prefix=f"sh{uid}", unit_ms=100, levels=levels, radix=radix))
    finally:
        conn.close()


@pytest.mark.timeout(240)
def test_a_new_shape_is_adopted_while_tasks_wait_in_the_old_one(shapes: tuple[Any, Any], collector: Collector,
                                                                 vhost: str, uid: str) -> None:
    old, new = shapes
    job_old, job_new = old.tasks["proj.job"], new.tasks["proj.job"]
    due: dict[str, float] = {}

    def publish(task: Any, tag: str, countdown: float) -> str:
        due[tag] = time.time() + countdown
        return str(task.apply_async((tag,), countdown=countdown).id)

    with running_worker(old):
        ids = {tag: publish(job_old, tag, 6.0 + i) for i, tag in enumerate(["o1", "o2", "o3", "o-cancel-before"])}
        ids["o-cancel-after"] = publish(job_old, "o-cancel-after", 12.0)
        cancel(old, ids["o-cancel-before"])  # recorded in the old ladder's cancel log
    assert not collector.items  # nothing was due yet: everything waits across the change
    namespace = f"sh{uid}."
    with running_worker(new):
        for i in range(3):
            ids[f"n{i}"] = publish(job_new, f"n{i}", 2.0 + i)
        listed = {t.task_id for t in pending(new)}
        assert {ids[t] for t in ("o1", "o2", "o3", "o-cancel-after", "n0", "n1", "n2")} <= listed
        assert ids["o-cancel-before"] not in listed
        [result] = cancel(new, ids["o-cancel-after"][:12])  # found in the old ladder's index, by its start
        assert result.found is not None and result.found.task_id == ids["o-cancel-after"]
        shown = run_delayq(new, "status").output  # what has not come due yet, the cancelled ones included
        assert re.search(r"previous shape 6x4: [1-5] still waiting \(delivered from it when due\)", shown), shown
        refused = run_delayq(new, "topology", "delete", "--shape", "6x4", "--yes", ok=False)
        assert refused.exit_code == 1 and "still wait" in refused.output and "Nothing was deleted" in refused.output
        expected = {"o1", "o2", "o3", "n0", "n1", "n2"}
        deadline = time.time() + 60
        while {r["tag"] for r in collector.items} < expected and time.time() < deadline:
            time.sleep(0.3)
        time.sleep(max(0.0, due["o-cancel-after"] + 2.0 - time.time()))
    runs = collector.items
    assert sorted(r["tag"] for r in runs) == sorted(expected), runs  # once each, cancelled ones never
    assert all(r["at"] >= due[r["tag"]] for r in runs), runs
    assert "previous shape 6x4: drained; remove it with" in run_delayq(new, "status").output
    before = broker_names(vhost)
    deleted = run_delayq(new, "topology", "delete", "--shape", "6x4", "--yes")
    assert "deleted ladder" in deleted.output
    after = broker_names(vhost)
    gone = before - after
    assert gone and all(".6x4." in name or name.endswith(".6x4") for name in gone), sorted(gone)
    assert not any(".6x4." in name for name in after if namespace in name), sorted(after)
    assert any(".5x8." in name for name in after)  # the current ladder and what it shares stay
    assert "previous shape 6x4: deleted" in run_delayq(new, "status").output
    with running_worker(new):  # and still work, with the old shape's streams gone
        ids["last"] = publish(job_new, "last", 1.0)
        assert [t.task_id for t in pending(new, task_id=ids["last"])] == [ids["last"]]
        collector.wait_for(len(expected) + 1, timeout=30)
    same = run_delayq(new, "topology", "delete", "--shape", "5x8", "--yes", ok=False)
    assert same.exit_code == 1 and "the shape this app uses now" in same.output
    typo = run_delayq(new, "topology", "delete", "--shape", "6by4", "--yes", ok=False)
    assert typo.exit_code == 1 and "give LEVELSxRADIX" in typo.output
