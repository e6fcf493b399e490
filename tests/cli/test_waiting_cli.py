"""``delayq run-now`` / ``reschedule`` / ``cancel-matching``, and ``pending`` / ``parking list`` tables at 80 columns."""

from __future__ import annotations

import time
from typing import Any

from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_delayq import pending
from celery_delayq.cli import delayq
from cli_helpers import run_delayq
from helpers import Collector, running_worker


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
        run_delayq(app, "cancel-matching", "--args", "doomed-", "--yes")
        assert "no waiting task matches --args doomed-" in run_delayq(app, "cancel-matching", "--args", "doomed-",
                                                                        "--yes").output
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
