"""``celery_delayq.pending(app, ...)``: the tasks waiting in the index, less those cancelled.

It sits above both the index reader (:mod:`.query`) and the cancel log
(:mod:`celery_delayq.cancels`), which itself looks tasks up in the index.
"""

from __future__ import annotations

import fnmatch
import functools
import time
from datetime import datetime, timezone

from ..cancels.supersede import cancel_state
from ..glue.app_ladder import ladder_for
from .ids import resolve_ids
from .query import PendingTask, read_index
from ..typing import CeleryApp

__all__ = ["pending"]


def pending(app: CeleryApp, *, task: str | None = None, queue: str | None = None, task_id: str | None = None,
            due_before: float | datetime | None = None, due_after: float | datetime | None = None,
            now: float | None = None) -> list[PendingTask]:
    """Every delayed task or retry waiting in ``app``'s ladder, soonest due first.

    Args:
        app: The Celery app (its ``delayq_*`` settings name the ladder).
        task: Only task names matching this glob (``proj.tasks.*``).
        queue: Only tasks for this queue (or, when the queue is not known, this routing key).
        task_id: Only this task: its id (reads one index shard: the fast lookup) or the
            start of exactly one waiting id (reads every shard), as ``cancel`` takes it.
        due_before: Only tasks due before this time (epoch seconds or an aware datetime).
        due_after: Only tasks due at or after this time.
        now: The time "waiting" is judged at (default: now).

    Raises:
        IndexUnavailable: the ladder has no index (off, broker before 3.9, not declared).
        AmbiguousTaskId: ``task_id`` is the start of several waiting ids (they are listed).
    """
    ladder = ladder_for(app)
    now = time.time() if now is None else now
    # (cancelled ids, superseded passes): one read of the cancel log, shared by the lookup and the filter
    state = functools.cache(lambda: cancel_state(app, now=now))
    if task_id is not None:
        resolved = resolve_ids(ladder, [task_id], now=now, cancelled=lambda: state()[0],
                               superseded=lambda: state()[1])
        waiting = list(resolved.found.values())
    else:
        waiting = [t for t in read_index(ladder, now=now).values() if t.due > now]
    if waiting:
        gone, replaced = state()  # replaced: passes a reschedule or run-now superseded
        waiting = [t for t in waiting if t.task_id not in gone and t.entry not in replaced]
    before, after = _epoch(due_before), _epoch(due_after)
    out = [t for t in waiting if _matches(t, task, queue, before, after)]
    out.sort(key=lambda t: (t.due, t.task_id))
    return out


def _matches(t: PendingTask, task: str | None, queue: str | None, before: float | None,
             after: float | None) -> bool:
    if task is not None and not fnmatch.fnmatchcase(t.task_name or "", task):
        return False
    if queue is not None and (t.queue if t.queue is not None else t.routing_key) != queue:
        return False
    if before is not None and not t.due < before:
        return False
    return after is None or t.due >= after


def _epoch(value: float | datetime | None) -> float | None:
    if value is None or isinstance(value, (int, float)):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()
