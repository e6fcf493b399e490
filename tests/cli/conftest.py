"""CLI fixtures: the ``delayq`` group run in-process with Celery's own CLI context, on the real broker."""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any, Callable, Iterator

import amqp
import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_delayq.cli import delayq
from celery_delayq.ladder import LadderSpec
from celery_delayq.topology import Topology

BROKER_HOST = os.environ.get("DELAYQ_TEST_BROKER_HOST", "127.0.0.1:5672")


def run_delayq(app: Any, *args: str, ok: bool = True, input: str | None = None) -> Result:
    """``celery -A app delayq ARGS`` in-process; stdin is not a terminal, as in a pipeline."""
    result = CliRunner().invoke(delayq, list(args), obj=CLIContext(app=app, no_color=True, workdir=None),
                                env={"COLUMNS": "200"}, input=input, catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def broker_names(vhost: str) -> set[str]:
    """Every queue and exchange of the vhost, as ``queue NAME`` / ``exchange NAME`` (rabbitmqctl)."""
    names: set[str] = set()
    for kind in ("queue", "exchange"):
        out = subprocess.run(["rabbitmqctl", "-q", f"list_{kind}s", "-p", vhost, "name", "--no-table-headers"],
                             check=True, capture_output=True, text=True, timeout=60,
                             env=dict(os.environ)).stdout
        names.update(f"{kind} {line.strip()}" for line in out.splitlines() if line.strip())
    return names


@pytest.fixture
def ladder_app(make_app: Callable[..., Any], uid: str, vhost: str) -> Iterator[Any]:
    """An app with a small ladder of this test's own (3 levels, 1 s unit), not declared; deleted after."""
    app = make_app(delayq_prefix=f"ro{uid}", delayq_levels=3, delayq_unit_ms=1000)
    yield app
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        with contextlib.suppress(Exception):
            Topology(LadderSpec(prefix=f"ro{uid}", levels=3, unit_ms=1000), "quorum").delete(conn, if_empty=False)
        with contextlib.suppress(Exception):
            conn.channel().queue_delete(f"ro{uid}.parking")
    finally:
        conn.close()
