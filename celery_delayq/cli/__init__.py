"""``celery -A APP delayq ...``: operate the ladder from the command line.

Registered as a Celery sub-command through the ``celery.commands`` entry
point, so it gets the app the usual way (``-A``) and Django settings work.
One module per command family; :mod:`.base` holds what they share,
including the single place that turns broker failures into one-line errors.
"""

from __future__ import annotations

import click

from .base import DelayqGroup
from .cancel import cancel
from .doctor import doctor
from .export import export
from .metrics import metrics
from .parking import parking
from .pending import pending
from .reschedule import cancel_matching, reschedule, run_now
from ..analytics.command import report_command
from .status import status
from .topology import topology
from .web import web

__all__ = ["delayq"]


@click.group(name="delayq", cls=DelayqGroup)
def delayq() -> None:
    """The delay ladder: topology, status, waiting tasks, cancel, export, parked messages, web page, analytics report."""


delayq.add_command(topology)
delayq.add_command(status)
delayq.add_command(export)
delayq.add_command(parking)
delayq.add_command(doctor)
delayq.add_command(pending)
delayq.add_command(cancel)
delayq.add_command(cancel_matching)
delayq.add_command(run_now)
delayq.add_command(reschedule)
delayq.add_command(metrics)
delayq.add_command(web)
delayq.add_command(report_command)
