"""``delayq run-now`` / ``reschedule`` / ``cancel-matching``, and ``pending`` / ``parking list`` tables at 80 columns."""

from __future__ import annotations

import time
import uuid
from typing import Any

from celery.bin.base import CLIContext
from click.testing import CliRunner

import amqp

from celery_delayq import DelayedRetryTask, pending
from celery_delayq.cli import delayq
from cli_helpers import run_delayq
from helpers import BROKER_HOST, Collector, entity_exists, queue_depth, running_worker


def _narrow(app: Any, *args: str) -> str:
    """Output as a pipe gets it: 80 columns."""
    result = CliRunner().invoke(delayq, list(args), obj=CLIContext(app=app, no_color=True, workdir=None),
                                env={"COLUMNS": "80"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_run_now_and_cancel_matching_from_the_cli(make_app, collector: Collector) -> None:
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.a_rather_long_module_path.tasks.send_invoice_reminder", bind=True)
    def job(self: Any, tag: str) -> None:
        collector.add(tag=tag, id=self.request.id)

    with running_worker(app):
        now = job.apply_async(("now",), countdown=300)
        doomed = [job.apply_async((f"doomed-{i}",), countdown=300) for i in range(2)]
        table = _narrow(app, "pending")
        lines = table.splitlines()
        assert all(len(line) <= 80 for line in lines), table
        assert all(any(t.id in line for line in lines) for t in [now, *doomed])  # ids whole, never broken
        assert "no waiting task matches --id nope" in _narrow(app, "pending", "--id", "nope")
        dry = run_delayq(app, "cancel-matching", "--args", "doomed-", "--dry-run").output
        assert "2 waiting task(s) match --args doomed-" in dry
        assert "not without --yes" in run_delayq(app, "cancel-matching", "--args", "doomed-", ok=False).output
        run_delayq(app, "cancel-matching", "--args", "doomed-", "--yes", "--expect", "2")
        assert "no waiting task matches --args doomed-" in run_delayq(app, "cancel-matching", "--args", "doomed-",
                                                                        "--yes", "--expect", "0").output
        out = run_delayq(app, "run-now", now.id, "--yes").output
        assert f"task {now.id}" in out and "runs now" in out
        collector.wait_for(1, timeout=15)
        assert [t.task_id for t in pending(app, task=job.name)] == []  # the session ladder holds other tests' tasks
        missing = run_delayq(app, "reschedule", now.id, "10m", "--yes", ok=False)
        assert missing.exit_code == 1 and "was run now or moved" in missing.output
        time.sleep(1)
    assert [i["tag"] for i in collector.items] == ["now"]
    refused = run_delayq(app, "cancel", now.id, ok=False)  # it ran: a cancel says so, and records nothing
    assert refused.exit_code == 1 and "was run now or moved" in refused.output, refused.output


def test_parking_list_says_when_nothing_matches(make_app) -> None:
    app = make_app(delayq_enabled=True)
    out = _narrow(app, "parking", "list", "--task", "nothing.*")
    assert "nothing has been parked yet" in out or "no parked message" in out


def _refusal(result: Any, code: int) -> str:
    """The one line a refused command prints on stderr (no traceback, nothing else)."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return str(lines[0])


def _audit_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery_delayq.audit"]


def test_a_bad_due_time_is_refused_and_the_task_keeps_waiting(make_app, collector: Collector, caplog) -> None:
    """``reschedule ID -5m`` (or a past time, "", a huge number, beyond the app's limit) refuses in one line
    naming the reason, and the task neither runs now nor moves; an unknown id is exit 1."""
    app = make_app(delayq_enabled=True, delayq_max_delay=3600)

    @app.task(name=f"{app.main}.later", bind=True)
    def later(self: Any, tag: str) -> None:
        collector.add(tag=tag)

    with running_worker(app):
        waiting = later.apply_async(("later",), countdown=600)
        [before] = pending(app, task_id=waiting.id)
        an_hour_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 3600))
        for bad, says in [("-5m", "run-now"), (an_hour_ago, "run-now"), ("", "empty"),
                          ("99999999999999999999", "outside the years 1970-9999"),
                          ("999999999999", "outside the years 1970-9999"), ("2h", "delayq_max_delay")]:
            line = _refusal(run_delayq(app, "reschedule", waiting.id, bad, "--yes", ok=False), 2)
            assert line.startswith("Error: Invalid value for 'WHEN'") and says in line, (bad, line)
        for bad_id in ("", "\udcff", "x" * 300):
            line = _refusal(run_delayq(app, "reschedule", bad_id, "10m", "--yes", ok=False), 2)
            assert "Invalid value for 'TASK_ID'" in line
        unknown = str(uuid.uuid4())
        assert "no task" in _refusal(run_delayq(app, "reschedule", unknown, "10m", "--yes", ok=False), 1)
        assert "no task" in _refusal(run_delayq(app, "run-now", unknown, "--yes", ok=False), 1)
        time.sleep(2.0)  # a refused reschedule used to run the task now: it would have run by now
        assert collector.items == []
        [after] = pending(app, task_id=waiting.id)
        assert after.due == before.due
        refused = [line for line in _audit_lines(caplog) if "refused=" in line]
        assert len([line for line in refused if "action=reschedule" in line and "via=cli" in line]) == 10
        assert any("action=run-now" in line and unknown in line for line in refused)
        done = run_delayq(app, "cancel", waiting.id)  # what it did: one audit line, shown to the operator
        assert f"action=cancel ids=1 [{waiting.id}]" in done.stderr and "who=cli:" in done.stderr
    assert pending(app, task_id=waiting.id) == []


def test_cancel_matching_needs_a_selection_and_the_count_it_confirms(make_app, caplog) -> None:
    """No filter is refused, --yes needs --expect, a count that changed cancels nothing; then exactly those."""
    app = make_app(delayq_enabled=True)

    @app.task(name=f"{app.main}.job")
    def job(tag: str) -> None:
        return None

    with running_worker(app):
        tag = uuid.uuid4().hex
        tasks = [job.apply_async((f"{tag}-{i}",), countdown=600) for i in range(2)]

        def matching(*args: str, ok: bool = False) -> Any:
            return run_delayq(app, "cancel-matching", *args, ok=ok)

        assert "no filter" in _refusal(matching("--yes", "--expect", "2"), 1)
        assert "cannot be combined" in _refusal(matching("--all", "--args", tag, "--dry-run"), 1)
        assert "--dry-run" in _refusal(matching("--args", tag, "--yes"), 1)
        dry = matching("--args", tag, "--dry-run", ok=True).output
        assert f"2 waiting task(s) match --args {tag}" in dry and "--yes --expect 2" in dry
        assert "not the 3 confirmed" in _refusal(matching("--args", tag, "--yes", "--expect", "3"), 1)
        assert sorted(t.task_id for t in pending(app, task=job.name)) == sorted(t.id for t in tasks)
        done = matching("--args", tag, "--yes", "--expect", "2", ok=True)
        assert "cancelled 2 task(s)" in done.stdout
        [line] = [line for line in done.stderr.splitlines() if "delayq audit:" in line]
        assert "action=cancel-matching ids=2" in line and all(t.id in line for t in tasks)
        assert f'filter="--args {tag}"' in line
        assert pending(app, task=job.name) == []
    assert len([line for line in _audit_lines(caplog) if "action=cancel-matching" in line and "refused=" in line]) == 4


def test_a_moved_task_waits_in_the_ladder_when_this_process_never_bound_it(make_app, uid: str, vhost: str) -> None:
    """#31 by hand: an app without ``delayq_enabled`` whose ``DelayedRetryTask`` tasks are bound only where
    they are published. ``celery -A proj delayq reschedule`` (and ``delayq web``) load the app but never
    bind its tasks, so the moved copy went to the task queue as a plain Celery ETA message: out of the
    waiting list, held in a worker's memory, no longer cancellable. It waits in the ladder again."""
    publisher = make_app()

    @publisher.task(base=DelayedRetryTask, name=f"{publisher.main}.remind")
    def remind(tag: str) -> None:
        pass

    waiting = remind.apply_async(("moved",), countdown=300)
    operator = make_app()  # the same settings, as the CLI loads them: its tasks are never bound
    deadline = time.monotonic() + 15
    while not pending(operator, task_id=waiting.id) and time.monotonic() < deadline:
        time.sleep(0.2)
    moved_at = time.time()
    out = run_delayq(operator, "reschedule", waiting.id, "10m", "--yes").output
    assert f"task {waiting.id}" in out and "now due" in out
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        queue = f"q.{uid}"  # nothing went to the task queue itself
        assert not entity_exists(conn, "queue", queue) or queue_depth(conn, queue) == 0
    finally:
        conn.close()
    listed = []
    while not listed and time.monotonic() < deadline + 15:
        listed = pending(operator, task_id=waiting.id)
        time.sleep(0.2)
    [moved] = listed
    assert moved_at + 590 < moved.due < moved_at + 610
    run_delayq(operator, "cancel", waiting.id)
