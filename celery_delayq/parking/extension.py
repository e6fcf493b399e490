"""The ``parking`` extension: a ``DelayedRetryTask`` attempt that gives up is parked, not dropped.

The glue asks the app's extensions to park; this one answers with :func:`~celery_delayq.parking.park.park_attempt`,
so the glue imports nothing of :mod:`celery_delayq.parking`. A task's ``delayq_park``/``delayq_park_on`` decide.
"""

from __future__ import annotations

from typing import Any

from ..glue.app_ladder import AppLadder
from ..glue.extensions import Extension
from ..policies.resolve import RetryOptions
from .park import park_attempt

__all__ = ["ParkingExtension"]


class ParkingExtension(Extension[AppLadder]):
    """Parks exhausted (or ``park_on``) attempts in the parking queue, confirmed."""

    name = "parking"

    def park(self, task: Any, request: Any, exc: BaseException, *, reason: str, options: RetryOptions) -> None:
        """Move the attempt's message to ``options.parking_queue`` (raises ``ParkingFailed``)."""
        park_attempt(task, request, exc, reason=reason, options=options)

    def describe(self, ladder: AppLadder) -> str:
        """Where exhausted retries go."""
        config = ladder.config
        if not config.park:
            return "off for the app (delayq_park=False); tasks may still ask for it"
        return f"exhausted retries parked in {config.parking_queue or config.prefix + '.parking'}"
