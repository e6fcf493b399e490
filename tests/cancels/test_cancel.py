"""Durable cancel (``celery_delayq.cancel`` / ``delayq cancel``) and durable Celery revoke, on a real broker.

A cancelled task never runs: not when a worker is up, not when no worker
heard the cancel (Celery's own revoke would be lost), not after every
worker was killed with ``kill -9`` and restarted before the due time. The
result backend shows ``REVOKED``, as Celery's revoke does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

import celery_delayq
from celery_delayq import AmbiguousTaskId, TaskIdNotFound, cancel, pending, signals
from celery_delayq.cancels import cancelled_ids
from celery_delayq.glue.app_ladder import index_of
from celery_delayq.index.cancel_log import AT, CANCEL, REASON, UNTIL, record
from celery_delayq.index.lookup import read_cancel_book
from celery_delayq.inputs import BadInput
from celery_delayq.ladder.index_layout import MARGIN_S
from celery_delayq.index.stream import StreamReader, reader_connection
from helpers import Collector, running_worker


# -- broker -------------------------------------------------------------------------------
@pytest.fixture
def backend(tmp_path: Path) -> str:
    """A result backend every process can read (Celery's file system backend)."""
    path = tmp_path / "results"
    path.mkdir()
    return f"file://{path}"


@pytest.fixture
def cancel_signals() -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def on(sender: Any = None, **kw: Any) -> None:
        got.append(kw)

    signals.message_cancelled.connect(on, weak=False)
    yield got
    signals.message_cancelled.disconnect(on)


def _wait_state(result: Any, state: str, timeout: float = 20.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if result.state == state:
            return state
        time.sleep(0.1)
    return str(result.state)


def test_cancelled_task_never_runs_and_is_revoked(make_app, backend: str, collector: Collector,
                                                  cancel_signals: list[dict[str, Any]]) -> None:
    app = make_app(delayq_enabled=True, result_backend=backend)

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag, id=self.request.id)

    with running_worker(app):
        doomed = job.apply_async(("doomed",), countdown=2.5)
        kept = job.apply_async(("kept",), countdown=2.5)
        [result] = cancel(app, doomed.id)
        assert result.found is not None and result.found.task_id == doomed.id
        assert abs(result.until - (result.found.due + MARGIN_S)) < 1e-6  # expires a day after its due time
        assert [t.task_id for t in pending(app, task=f"{app.main}.*")] == [kept.id]
        collector.wait_for(1, timeout=20)
        assert _wait_state(doomed, "REVOKED") == "REVOKED"
        time.sleep(0.5)
    assert [r["tag"] for r in collector.items] == ["kept"]
    reasons = [(s["task_id"], s["reason"]) for s in cancel_signals]
    assert (doomed.id, "requested") in reasons and (doomed.id, "cancelled") in reasons
    assert all(s["task_id"] == doomed.id for s in cancel_signals)


def test_celery_revoke_is_durable_without_any_worker(make_app, backend: str, collector: Collector) -> None:
    """Celery's revoke only reaches the workers running then; through the ladder it is recorded first."""
    app = make_app(delayq_enabled=True, result_backend=backend)

    @app.task(name=f"{app.main}.job", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag)

    by_control = job.apply_async(("control",), countdown=3)
    by_result = job.apply_async(("result",), countdown=3)
    days = job.apply_async(("days",), countdown=3 * 86400)
    kept = job.apply_async(("kept",), countdown=3)
    app.control.revoke(by_control.id)  # no worker runs: Celery's broadcast reaches no one
    by_result.revoke()
    [far] = cancel(app, days.id)
    assert far.found is not None and far.until > time.time() + 4 * 86400 - 60
    assert {by_control.id, by_result.id, days.id} <= cancelled_ids(app)
    with running_worker(app):
        # The 3-day task "arrives" now: the same id, straight to its queue, as the ladder would deliver it.
        job.apply_async(("days",), task_id=days.id)
        collector.wait_for(1, timeout=20)
        for r in (by_control, by_result, days):
            assert _wait_state(r, "REVOKED") == "REVOKED", r
        time.sleep(0.5)
    assert [r["tag"] for r in collector.items] == ["kept"]
    assert kept.state == "SUCCESS"


def test_forced_cancel_of_an_unknown_id_holds_for_the_longest_delay(make_app) -> None:
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app).publisher.declare()
    unknown = str(uuid.uuid4())
    before = time.time()
    [result] = cancel(app, unknown, force=True)
    spec = celery_delayq.ladder_for(app).config.spec
    assert result.found is None
    assert before + spec.max_delay_s + MARGIN_S <= result.until <= time.time() + spec.max_delay_s + MARGIN_S
    assert unknown in cancelled_ids(app)
    assert unknown not in cancelled_ids(app, now=result.until + 1)  # and then it expires


WORKER_APP = textwrap.dedent('''
    import json, os, time
    from celery import Celery
    app = Celery("{name}", broker=os.environ["K_BROKER"], backend=os.environ["K_BACKEND"])
    app.conf.update(task_default_queue=os.environ["K_QUEUE"], delayq_prefix=os.environ["K_PREFIX"],
                    delayq_enabled=True, broker_heartbeat=0, worker_hijack_root_logger=False)

    @app.task(name="{name}.job", bind=True)
    def job(self, tag):
        with open(os.environ["K_LOG"], "a") as fh:
            fh.write(json.dumps({{"tag": tag, "id": self.request.id, "at": time.time()}}) + "\\n")
        return tag
''')


def _runs(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _start_worker(env: dict[str, str], cwd: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", name, "worker", "-P", "solo", "--without-heartbeat",
                             "--without-gossip", "--without-mingle", "-l", "WARNING"],
                            env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ran(log: Path, tag: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(r["tag"] == tag for r in _runs(log)):
            return
        time.sleep(0.1)
    raise AssertionError(f"task {tag!r} did not run within {timeout} s: {_runs(log)}")


def _worker_project(tmp_path: Path, name: str, queue: str, broker_url: str, backend: str, prefix: str,
                    make_app: Any) -> tuple[Path, dict[str, str], Any]:
    """A worker app module ``name`` in ``tmp_path``, its run log, its environment, and the same app here."""
    (tmp_path / f"{name}.py").write_text(WORKER_APP.format(name=name))
    log = tmp_path / "runs.jsonl"
    env = dict(os.environ, K_BROKER=broker_url, K_BACKEND=backend, K_QUEUE=queue, K_PREFIX=prefix,
               K_LOG=str(log), PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return log, env, make_app(delayq_enabled=True, result_backend=backend, task_default_queue=queue)


def test_cancel_survives_kill_9_of_every_worker(tmp_path: Path, broker_url: str, prefix: str, uid: str,
                                                backend: str, make_app) -> None:
    """Cancel, kill -9 the only worker, restart it before the due time: the task never runs, REVOKED."""
    name = f"k{uid}"
    log, env, app = _worker_project(tmp_path, name, f"k.{uid}", broker_url, backend, prefix, make_app)

    @app.task(name=f"{name}.job")
    def job(tag: str) -> str:  # the same task, sent from here
        return tag

    worker = _start_worker(env, tmp_path, name)
    try:
        job.apply_async(("warm-up",))
        _wait_ran(log, "warm-up", timeout=60)  # the worker has loaded the cancel log and consumes
        doomed = job.apply_async(("doomed",), countdown=8)
        kept = job.apply_async(("kept",), countdown=8)
        [result] = cancel(app, doomed.id)
        assert result.found is not None
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        time.sleep(1.0)  # every worker is gone
        worker = _start_worker(env, tmp_path, name)
        _wait_ran(log, "kept", timeout=40)
        assert _wait_state(kept, "SUCCESS", timeout=20) == "SUCCESS"
        assert _wait_state(doomed, "REVOKED", timeout=20) == "REVOKED"
        time.sleep(1.0)
        tags = [r["tag"] for r in _runs(log)]
        assert "doomed" not in tags and tags.count("kept") == 1, tags
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()


CLI_APP = '''
from celery import Celery
app = Celery("{name}", broker="{url}")
app.conf.update(task_default_queue="{queue}", delayq_prefix="{prefix}", delayq_enabled=True, broker_heartbeat=0)
'''


def test_cli_cancel(make_app, broker_url: str, prefix: str, tmp_path: Path) -> None:
    name = f"cc{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{name}.py").write_text(CLI_APP.format(name=name, url=broker_url, queue=f"q.{name}", prefix=prefix))
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{name}.later")
    def later() -> None: ...

    waiting = later.apply_async(countdown=3600)
    unknown = str(uuid.uuid4())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "celery", "-A", name, "delayq", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))

    out = cli("cancel", waiting.id, unknown, "--json", "--force")
    assert out.returncode == 0, out.stderr
    doc = {d["task_id"]: d for d in json.loads(out.stdout)}
    assert doc[waiting.id]["waiting"] is True and doc[waiting.id]["task"] == f"{name}.later"
    assert doc[unknown]["waiting"] is False and doc[unknown]["until"].endswith("Z")
    assert pending(app, task_id=waiting.id) == []
    assert {waiting.id, unknown} <= cancelled_ids(app)
    text = cli("cancel", waiting.id)
    assert text.returncode == 0 and "it will not run" in text.stdout
    assert cli("cancel").returncode == 2  # an id is required


# -- safety: unknown ids, prefixes ---------------------------------------------------------
def test_cancel_of_an_unknown_id_is_an_error_and_records_nothing(make_app, uid: str) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    waiting = later.apply_async(countdown=3600, task_id=f"{uid}-waiting-{uuid.uuid4()}")
    typo = waiting.id[:-1] + ("0" if waiting.id[-1] != "0" else "1")
    with pytest.raises(TaskIdNotFound) as raised:
        cancel(app, waiting.id, typo)  # one good id, one typo: nothing is recorded
    assert raised.value.task_ids == [typo] and "waiting task" in str(raised.value)
    assert celery_delayq.ladder_for(app).config.spec.namespace in str(raised.value)  # names what it read
    assert "--force" in str(raised.value)
    assert not {waiting.id, typo} & cancelled_ids(app)
    assert [t.task_id for t in pending(app, task_id=waiting.id)] == [waiting.id]
    [forced] = cancel(app, typo, force=True)
    assert forced.task_id == typo and forced.found is None and typo in cancelled_ids(app)


def test_an_id_that_is_not_one_is_refused_even_forced_and_records_nothing(make_app, uid: str) -> None:
    """Empty, blank, not UTF-8 (a command line's ``$'\\xff'``), a control character, too long: ``BadInput``
    naming the id, before anything is read or recorded, whatever ``force`` or ``lookup`` say."""
    app = make_app(delayq_enabled=True)
    celery_delayq.install(app).publisher.declare()
    fine = f"{uid}-fine-{uuid.uuid4()}"
    for bad in ("", "   ", "\udcff", "a\x00b", "x" * 256):
        for options in ({"force": True}, {"lookup": False}):
            with pytest.raises(BadInput, match="task id"):
                cancel(app, fine, bad, **options)
    assert fine not in cancelled_ids(app)


def test_a_unique_prefix_resolves_and_an_ambiguous_one_lists_its_candidates(make_app, uid: str) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.later")
    def later() -> None: ...

    stem = f"{uid}{uuid.uuid4().hex[:6]}"
    one, two = (later.apply_async(countdown=3600, task_id=f"{stem}{n}-{uuid.uuid4()}") for n in ("a", "b"))
    assert [t.task_id for t in pending(app, task_id=f"{stem}a")] == [one.id]  # pending --id PREFIX
    with pytest.raises(AmbiguousTaskId) as raised:
        pending(app, task_id=stem)
    assert sorted(raised.value.candidates) == sorted([one.id, two.id])
    with pytest.raises(AmbiguousTaskId) as raised:
        cancel(app, stem)
    assert sorted(raised.value.candidates) == sorted([one.id, two.id]) and one.id in str(raised.value)
    assert not {one.id, two.id} & cancelled_ids(app)
    [result] = cancel(app, f"{stem}b")
    assert result.task_id == two.id and result.given == f"{stem}b" and result.found is not None
    assert [t.task_id for t in pending(app, task_id=stem)] == [one.id]  # the cancelled one is not waiting
    with pytest.raises(TaskIdNotFound):
        cancel(app, two.id[:3])  # under four characters: never taken as a prefix


# -- a cancel lasts until its task's due time, however far ---------------------------------
def test_celery_revoke_of_a_40_day_task_holds_until_it_is_due(make_app) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.job")
    def job() -> None: ...

    far = job.apply_async(countdown=40 * 86400)
    [waiting] = pending(app, task_id=far.id)
    far.revoke()  # Celery's revoke, recorded in the cancel log first
    book = read_cancel_book(*index_of(app))
    assert book.cancelled(far.id, now=waiting.due - 60)  # not only for the ladder's 31 days
    assert book.due(far.id) == waiting.due


def _log_entries(app: Any, task_id: str) -> list[dict[str, Any]]:
    connection, layout = index_of(app)
    with reader_connection(connection) as raw:
        reader = StreamReader(raw, layout.cancel_queue)
        return [h for _o, h, _m in reader.read("first", (CANCEL, UNTIL, AT, REASON)) if h.get(CANCEL) == task_id]


def test_a_40_day_cancel_outlives_the_logs_retention(tmp_path: Path, broker_url: str, prefix: str, uid: str,
                                                     backend: str, make_app) -> None:
    """The cancel log keeps entries ~32 days; a 40-day task's cancel is written again by workers in time.

    Stands for a cancel made 20 days ago (its entry says so) and a worker started now: on the old
    code the entry would leave the stream at day 32 and a worker started after that would run the task.
    """
    name = f"l{uid}"
    log, env, app = _worker_project(tmp_path, name, f"l.{uid}", broker_url, backend, prefix, make_app)

    @app.task(name=f"{name}.job")
    def job(tag: str) -> str:
        return tag

    far = job.apply_async(("far",), countdown=40 * 86400)  # laps: longer than the ladder's 31 days
    [result] = cancel(app, far.id)
    assert result.found is not None and result.until >= result.found.due + MARGIN_S - 1e-6
    connection, layout = index_of(app)
    with reader_connection(connection) as raw:
        keep = layout.max_age_s
        assert result.until > time.time() + keep  # the entry alone would not last: renewal is needed
        twenty_days_ago = time.time() - 20 * 86400
        record(raw, layout, [(far.id, result.until, "cancelled")], at=twenty_days_ago)
    # Only the old-looking entry may count: drop the fresh one by checking what a worker does
    # with the log as it is now (fresh + old), then with an old entry only.
    old_only = f"{uid}-old-{uuid.uuid4()}"
    until = time.time() + 40 * 86400
    with reader_connection(connection) as raw:
        record(raw, layout, [(old_only, until, "cancelled")], at=twenty_days_ago)
    started = time.time()
    worker = _start_worker(env, tmp_path, name)
    try:
        job.apply_async(("warm-up",))
        _wait_ran(log, "warm-up", timeout=60)  # the worker loaded the log (and renewed) before consuming
        renewed = [e for e in _log_entries(app, old_only) if e.get(REASON) == "renewed"]
        assert renewed and float(renewed[-1][AT]) >= started and float(renewed[-1][UNTIL]) == until
        assert not [e for e in _log_entries(app, far.id) if e.get(REASON) == "renewed"]  # its entry is fresh
        # The 40-day task arrives (its id, straight to its queue, as the ladder would deliver it).
        job.apply_async(("far",), task_id=far.id)
        job.apply_async(("after",))
        _wait_ran(log, "after", timeout=40)
        assert _wait_state(far, "REVOKED", timeout=20) == "REVOKED"
        assert "far" not in [r["tag"] for r in _runs(log)]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
