"""Durable cancel of delayed tasks: ``celery_delayq.cancel(app, *task_ids)``.

A cancel is a confirmed entry in the ladder's cancel log (a RabbitMQ stream,
:mod:`celery_delayq.index.cancel_log`). Every worker reads the log when it starts and follows it
(:mod:`.worker`), and drops a cancelled task when it arrives, through
Celery's own revocation path, so the result backend shows ``REVOKED``. So a
cancel holds however long the delay, across worker restarts (``kill -9``
included) and broker restarts, unlike Celery's in-memory ``revoke``, which
:func:`celery_delayq.install` makes durable the same way (:mod:`.revoke`).

Which ids a cancel takes and how long it holds: :func:`cancel`, and docs/cancel.md.

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
