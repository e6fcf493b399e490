"""Durable cancel of delayed tasks: ``celery_delayq.cancel(app, *task_ids)`` (docs/cancel.md).

A cancel is a confirmed entry in the ladder's cancel log (a stream, :mod:`celery_delayq.index.cancel_log`)
that every worker reads at start and follows, dropping the task through Celery's own revoke path: it holds
across worker and broker restarts, as Celery's ``revoke`` does once installed. :mod:`.requests` records
cancels, :mod:`.reschedule` moves tasks, :mod:`.worker` follows the log, :mod:`.revoke` hooks Celery's revoke.
"""

from __future__ import annotations

from .extension import CancelsExtension
from .requests import CancelResult, cancel, cancelled_ids, record_cancels
from .revoke import hook_revoke, unhook_revoke
from .worker import CancelStep, mark_if_cancelled, stop_follower

__all__ = ["cancel", "CancelResult", "cancelled_ids", "record_cancels", "CancelStep", "CancelsExtension",
           "hook_revoke", "unhook_revoke", "mark_if_cancelled", "stop_follower"]
