"""The ``cancels`` extension: durable cancels and revokes for the app (:mod:`celery_delayq.glue.extensions`).

It hooks Celery's ``revoke`` (:mod:`.revoke`), runs the worker's cancel-log follower
(:class:`~celery_delayq.cancels.worker.CancelStep`; the follower is this extension's state), and answers
Celery's "is this request revoked?": a cancelled one is dropped as revoked, a superseded pass quietly.
"""

from __future__ import annotations

from typing import Any

from ..glue.app_ladder import AppLadder
from ..glue.extensions import Extension
from .requests import record_cancels
from .revoke import hook_revoke, unhook_revoke
from .worker import CancelFollower, CancelStep, drop_if_superseded, mark_if_cancelled

__all__ = ["CancelsExtension"]


class CancelsExtension(Extension[AppLadder]):
    """Durable cancels: the revoke hook, the worker's cancel-log follower, and the revoked check."""

    name = "cancels"
    consumer_steps = (CancelStep,)

    def __init__(self) -> None:
        #: The worker's follower of the app's cancel log (``None`` outside a worker, or before it starts).
        self.follower: CancelFollower | None = None

    def install(self, ladder: AppLadder) -> None:
        """Celery's revoke of the app is recorded in the cancel log too."""
        hook_revoke(ladder.app, record_cancels)

    def uninstall(self, ladder: AppLadder) -> None:
        """Unhook revoke and stop the follower."""
        unhook_revoke(ladder.app)
        follower, self.follower = self.follower, None
        if follower is not None:
            follower.stop()

    def request_revoked(self, ladder: AppLadder, request: Any) -> bool:
        """A superseded pass is dropped here; a cancelled id joins Celery's revoked set (Celery drops it)."""
        follower = self.follower
        if follower is None:
            return False
        if drop_if_superseded(request, follower):
            return True
        mark_if_cancelled(request, follower)
        return False

    def cancelled(self, ladder: AppLadder, task_id: str) -> bool:
        """Is ``task_id`` in the cancel log this worker follows?"""
        follower = self.follower
        return follower is not None and follower.book.cancelled(task_id)

    def describe(self, ladder: AppLadder) -> str:
        """Whether this process follows the cancel log."""
        return "following the cancel log" if self.follower is not None else "revokes recorded in the cancel log"
