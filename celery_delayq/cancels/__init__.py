"""Durable cancel of delayed tasks: ``celery_delayq.cancel(app, *task_ids)``.

A cancel is a confirmed entry in the ladder's cancel log (a RabbitMQ stream,
:mod:`celery_delayq.index.cancel_log`). Every worker reads the log when it starts and follows it
(:mod:`.worker`), and drops a cancelled task when it arrives, through
Celery's own revocation path, so the result backend shows ``REVOKED``. So a
cancel holds however long the delay, across worker restarts (``kill -9``
included) and broker restarts, unlike Celery's in-memory ``revoke``, which
:func:`celery_delayq.install` makes durable the same way (:mod:`.revoke`).

Each id given to :func:`cancel` must name a waiting task, fully or by a
unique start (:mod:`celery_delayq.index.ids`); ``force=True`` records the
others as given. An entry holds until its task's due time plus a margin (one
day), however far away (workers write it again before the log's retention
drops it, :mod:`.worker`), or, when the task is not found waiting in the
index, for the ladder's maximum delay plus the margin; then it expires.

* :mod:`.requests`: :func:`cancel` and the other records; :mod:`.reschedule`: run now, move;
* :mod:`.worker`, :mod:`.extension`, :mod:`.revoke`: the worker's follower, the extension, Celery's revoke.
"""

from __future__ import annotations

from .extension import CancelsExtension
from .requests import CancelResult, cancel, cancelled_ids, record_cancels
from .revoke import hook_revoke, unhook_revoke
from .worker import CancelStep, mark_if_cancelled, stop_follower

__all__ = ["cancel", "CancelResult", "cancelled_ids", "record_cancels", "CancelStep", "CancelsExtension",
           "hook_revoke", "unhook_revoke", "mark_if_cancelled", "stop_follower"]
