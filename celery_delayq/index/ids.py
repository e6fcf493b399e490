"""Task ids as operators type them: the full id or a unique start of it, checked against the index.

An exact id reads one shard; otherwise a unique start of at least :data:`MIN_PREFIX` characters of a waiting,
uncancelled id (:func:`hidden`); otherwise :class:`TaskIdNotFound` or :class:`AmbiguousTaskId`. "Waiting" leaves
out what :func:`superseded` says was replaced. The rules and why: docs/how-it-works.md, "The index of waiting tasks".
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from ..errors import DelayqError
from ..ladder.index_layout import IndexLayout
from .cancel_book import CancelBook
from .query import PendingTask, read_index

if TYPE_CHECKING:  # pragma: no cover
    import kombu

__all__ = ["TaskIdError", "TaskIdNotFound", "AmbiguousTaskId", "Resolved", "resolve_ids", "superseded", "hidden",
           "CANDIDATES", "MIN_PREFIX"]

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


def superseded(task: PendingTask, book: CancelBook, now: float) -> bool:
    """Was this pass replaced by a run-now or a reschedule (its pass is cancelled in ``book``)?

    Then it is not waiting, whatever the index says: it ran, or its moved copy is not listed yet.
    """
    return book.pass_cancelled(task.entry, now)


def hidden(task: PendingTask, book: CancelBook, now: float) -> bool:
    """Is a pass the index lists not shown as waiting: its id cancelled, or the pass :func:`superseded`?"""
    return book.cancelled(task.task_id, now) or superseded(task, book, now)


def resolve_ids(connection: kombu.Connection, layout: IndexLayout, given: Iterable[str], *, now: float | None = None,
                book: Callable[[], CancelBook] = CancelBook, prefixes: bool = True) -> Resolved:
    """Resolve full ids and unique prefixes to the waiting tasks they name (in the index of ``layout``).

    ``book`` gives the cancel log (read only when needed: once an id is found, or a prefix is looked
    up; cache it). A full id whose latest pass is :func:`superseded` is not waiting (it is listed in
    ``moved``); prefixes skip :func:`hidden` tasks. ``prefixes=False`` takes every id as whole.

    Raises:
        AmbiguousTaskId: a prefix starts several waiting ids (the first such prefix).
        IndexUnavailable: there is no index to look in (off, broker before 3.9, not declared).
    """
    now = time.time() if now is None else now
    ids = [i for i in dict.fromkeys(str(g) for g in given)]
    exact = {k: v for k, v in read_index(connection, layout, task_ids=[i for i in ids if i], now=now).items()
             if v.due > now}
    moved = [i for i in ids if i in exact and superseded(exact[i], book(), now)]
    found = {i: exact[i] for i in ids if i in exact and i not in moved}
    rest = [i for i in ids if i not in found]
    namespace = layout.spec.namespace
    looked_at = f"index of ladder {namespace!r}: the shards of {len(ids)} id(s)"
    if prefixes and any(len(i) >= MIN_PREFIX and not _whole_uuid(i) for i in rest):
        cancels = book()
        waiting = sorted((t for t in read_index(connection, layout, now=now).values()
                          if t.due > now and not hidden(t, cancels, now)), key=lambda t: t.task_id)
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
