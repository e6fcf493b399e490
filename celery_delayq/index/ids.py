"""Task ids as operators type them: the full id or a unique start of it, checked against the index.

``delayq cancel`` and ``delayq pending --id`` (and :func:`celery_delayq.cancel`,
:func:`celery_delayq.pending`) resolve what they are given here, in one way:

1. an id some waiting task has exactly (one index shard is read);
2. otherwise the start of exactly one waiting task's id, of at least
   :data:`MIN_PREFIX` characters (every shard is read, since a prefix does
   not name a shard; a shorter start would fit some task by chance, as
   ``git`` refuses abbreviations under four characters). A whole UUID, the
   form of Celery's own ids, is taken as complete and never read as a
   prefix: a miss then costs one shard, not the whole index (1.2 s with
   5,000 waiting, measured), which is what a caller polling for a task it
   just published needs;
3. otherwise it is unknown (:class:`TaskIdNotFound`), or, when it starts
   several waiting ids, ambiguous (:class:`AmbiguousTaskId`, listing them).

"Waiting" is the index's word: the latest pass of the id is not due yet.
A prefix is matched against the waiting ids that are not cancelled (those
``delayq pending`` lists), so a start copied from that list never clashes
with a task cancelled before; a full id is found cancelled or not.
Before this, a typo or a prefix given to ``cancel`` was recorded as a cancel
of an id that no task has, reported as "not waiting", exit status 0, and the
task the operator meant still ran.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Collection, Iterable, Sequence

from ..errors import DelayqError
from .query import PendingTask, read_index

if TYPE_CHECKING:  # pragma: no cover
    from ..glue.app_ladder import AppLadder

__all__ = ["TaskIdError", "TaskIdNotFound", "AmbiguousTaskId", "Resolved", "resolve_ids", "CANDIDATES",
           "MIN_PREFIX"]

#: How many candidates an ambiguous prefix lists.
CANDIDATES = 10
#: The shortest start of an id that is resolved as a prefix.
MIN_PREFIX = 4


class TaskIdError(DelayqError, LookupError):
    """A task id given by an operator names no waiting task, or more than one."""


class TaskIdNotFound(TaskIdError):
    """No waiting task has this id or an id starting with it.

    Attributes:
        task_ids: The ids (or prefixes) that matched nothing.
        looked_at: What was read to find out (ladder, index entries).
    """

    def __init__(self, task_ids: Sequence[str], looked_at: str, *, moved: Sequence[str] = ()) -> None:
        self.task_ids = list(task_ids)
        self.looked_at = looked_at
        #: The ids among ``task_ids`` whose waiting copy was run now or moved (its pass is cancelled).
        self.moved = [i for i in task_ids if i in set(moved)]
        shown = ", ".join(repr(i) for i in self.task_ids)
        short = [i for i in self.task_ids if len(i) < MIN_PREFIX]
        hint = f" A start of an id needs at least {MIN_PREFIX} characters." if short else ""
        if self.moved:
            hint += (f" {', '.join(repr(i) for i in self.moved)} was run now or moved: its copy in the ladder is "
                     "cancelled, and a moved task can be cancelled once its new due time is listed.")
        super().__init__(
            f"no task waiting in the ladder has the id {shown}, or an id starting with it ({looked_at}).{hint} "
            "Check the id with `celery -A APP delayq pending`; a task that is not published yet can be "
            "cancelled in advance with `delayq cancel --force` (cancel(..., force=True)).")


class AmbiguousTaskId(TaskIdError):
    """The given start of an id fits several waiting tasks.

    Attributes:
        prefix: What was given.
        candidates: The waiting ids it starts (at most :data:`CANDIDATES`, sorted).
        total: How many waiting ids it starts.
    """

    def __init__(self, prefix: str, candidates: Sequence[str], total: int) -> None:
        self.prefix = prefix
        self.candidates = list(candidates)
        self.total = total
        more = f" (and {total - len(candidates)} more)" if total > len(candidates) else ""
        super().__init__(f"{prefix!r} starts the ids of {total} waiting tasks: {', '.join(self.candidates)}{more}; "
                         "give more of the id")


@dataclass(frozen=True)
class Resolved:
    """What :func:`resolve_ids` made of the ids given.

    Attributes:
        found: Given id (or prefix) -> the waiting task it names.
        unknown: The given ids that name no waiting task, in the order given.
        looked_at: What was read, in words (for error messages).
        moved: The unknown ids whose latest pass was run now or moved (superseded), so not waiting.
    """

    found: dict[str, PendingTask]
    unknown: list[str]
    looked_at: str
    moved: list[str] = field(default_factory=list)


def resolve_ids(ladder: AppLadder, given: Iterable[str], *, now: float | None = None,
                cancelled: Callable[[], Collection[str]] = frozenset,
                superseded: Callable[[], Collection[str]] = frozenset) -> Resolved:
    """Resolve full ids and unique prefixes to the waiting tasks they name.

    ``cancelled`` gives the cancelled ids, which prefixes skip (read only when a prefix is looked up).
    ``superseded`` gives the pass entries a run-now or a reschedule cancelled: a task whose latest
    pass is one of them is not waiting (it ran, or its moved copy is not listed yet), as
    ``delayq pending`` and ``reschedule`` judge it.

    Raises:
        AmbiguousTaskId: a prefix starts several waiting ids (the first such prefix).
        IndexUnavailable: there is no index to look in (off, broker before 3.9, not declared).
    """
    now = time.time() if now is None else now
    ids = [i for i in dict.fromkeys(str(g) for g in given)]
    exact = {k: v for k, v in read_index(ladder, task_ids=[i for i in ids if i], now=now).items() if v.due > now}
    replaced = superseded() if exact else frozenset()
    moved = [i for i in ids if i in exact and exact[i].entry and exact[i].entry in replaced]
    found = {i: exact[i] for i in ids if i in exact and i not in moved}
    rest = [i for i in ids if i not in found]
    namespace = ladder.config.spec.namespace
    looked_at = f"index of ladder {namespace!r}: the shards of {len(ids)} id(s)"
    if any(len(i) >= MIN_PREFIX and not _whole_uuid(i) for i in rest):
        gone = cancelled()
        replaced = superseded()
        waiting = sorted((t for t in read_index(ladder, now=now).values()
                          if t.due > now and t.task_id not in gone and not (t.entry and t.entry in replaced)),
                         key=lambda t: t.task_id)
        looked_at = f"index of ladder {namespace!r}: all {len(waiting):,} waiting task(s)"
        for prefix in rest:
            if len(prefix) < MIN_PREFIX or _whole_uuid(prefix):
                continue
            matches = [t for t in waiting if t.task_id.startswith(prefix)]
            if len(matches) > 1:
                raise AmbiguousTaskId(prefix, [t.task_id for t in matches[:CANDIDATES]], len(matches))
            if matches:
                found[prefix] = matches[0]
    return Resolved(found, [i for i in ids if i not in found], looked_at, moved)


def _whole_uuid(text: str) -> bool:
    """Is ``text`` a complete UUID in its canonical form (Celery's task ids), so no prefix of anything?"""
    try:
        return str(uuid.UUID(text)) == text.lower()
    except ValueError:
        return False
