"""Recording and reading cancels: :func:`cancel`, :func:`record_cancels`, :func:`cancelled_ids`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

from .. import signals
from ..app_ladder import ladder_for
from ..pending.layout import MARGIN_S
from ..pending.query import PendingTask, iso, open_layout, read_index
from ..pending.stream import reader_connection
from .book import CancelBook
from .log import load, record

__all__ = ["cancel", "CancelResult", "cancelled_ids", "record_cancels"]


@dataclass(frozen=True)
class CancelResult:
    """One recorded cancel.

    Attributes:
        task_id: The task id.
        until: Epoch seconds until which the cancel holds.
        found: The waiting pass found in the index (``None``: the task is not
            waiting in the ladder now; it is dropped if it arrives before ``until``).
    """

    task_id: str
    until: float
    found: PendingTask | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``delayq cancel --json``."""
        return {"task_id": self.task_id, "until": iso(self.until), "waiting": self.found is not None,
                "task": self.found.task_name if self.found else None,
                "due": self.found.due_iso if self.found else None}


def cancel(app: Any, *task_ids: str, lookup: bool = True) -> list[CancelResult]:
    """Cancel tasks by id: they will not run, however long they still wait.

    Returns once the cancels are confirmed by the broker, one
    :class:`CancelResult` per id. With ``lookup`` (the default) each id is
    looked up in the index first, so its cancel can expire soon after its
    due time and the result says whether it was waiting; ``lookup=False``
    skips that read (one index shard per id).

    Raises:
        IndexUnavailable: the broker has no streams (before RabbitMQ 3.9).
        PublishError: naming the ids whose cancel may not be recorded.
    """
    return record_cancels(app, task_ids, lookup=lookup, reason="cancelled")


def record_cancels(app: Any, task_ids: Iterable[str], *, lookup: bool = False,
                   reason: str = "cancelled") -> list[CancelResult]:
    """Record cancels of ``task_ids`` in the app's cancel log (see :func:`cancel`)."""
    ids = list(dict.fromkeys(str(t) for t in task_ids))
    if not ids:
        return []
    ladder = ladder_for(app)
    now = time.time()
    found: dict[str, PendingTask] = {}
    if lookup and ladder.config.index:
        found = {k: v for k, v in read_index(ladder, task_ids=ids, now=now).items() if v.due > now}
    longest = now + ladder.config.spec.max_delay_s + MARGIN_S
    results = [CancelResult(i, found[i].due + MARGIN_S if i in found else longest, found.get(i)) for i in ids]
    with reader_connection(ladder) as raw:
        layout = open_layout(ladder, raw)
        record(raw, layout, [(r.task_id, r.until, reason) for r in results],
               timeout=ladder.config.confirm_timeout)
    for r in results:
        p = r.found
        signals.message_cancelled.send(sender=app, task_id=r.task_id, task_name=p.task_name if p else "",
                                       queue=(p.queue or p.routing_key) if p else "",
                                       attempt=p.attempt if p else 0, reason="requested")
    return results


def cancelled_ids(app: Any, *, now: float | None = None) -> set[str]:
    """Every task id whose cancel holds at ``now``, read from the app's cancel log."""
    ladder = ladder_for(app)
    book = CancelBook()
    with reader_connection(ladder) as raw:
        layout = open_layout(ladder, raw)
        load(raw, layout, book, now=now)
    return book.live(now)
