"""``python -m celery_delayq.analytics``: the report command, run without Celery's CLI.

The command itself is :mod:`celery_delayq.cli.report` (also ``celery -A APP
delayq report``), so both spellings take the same options, and its time
options follow the one rule of every ``delayq`` command
(:class:`~celery_delayq.cli.when.Moment`).
"""

from __future__ import annotations

from celery_delayq.cli.report import main, report_command

__all__ = ["main", "report_command"]
