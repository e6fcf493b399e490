"""Helpers of the CLI tests (a module name of its own: ``conftest`` is ambiguous across test directories)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_delayq.cli import delayq

__all__ = ["run_delayq", "broker_names"]


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
