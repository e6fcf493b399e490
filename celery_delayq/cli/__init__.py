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


@click.group(name="delayq", cls=DelayqGroup, commands=[topology, status, export, parking, doctor, pending, cancel,
                                                       cancel_matching, run_now, reschedule, metrics, web,
                                                       report_command])
def delayq() -> None:
    """The delay ladder: topology, status, waiting tasks, cancel, export, parked messages, web page, analytics report."""
