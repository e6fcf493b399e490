"""What the page and the API read and do, on top of the package's own functions (no I/O of its own).

Every number comes from what the CLI uses (``delayq status``, the doctor, ``delayq pending``, the parking
queue's own operations, :func:`~celery_delayq.cancel`, :func:`~celery_delayq.cancels.reschedule.reschedule`);
what it returns is what the API answers (:mod:`.schemas`), so a route only asks and hands on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Annotated, Any, Callable, Iterator, Mapping, Sequence

from fastapi import Depends, Request

from ..telemetry.lasthour import last_hour
from ..audit import audit
from ..cancels.requests import CancelResult, cancel
from ..cancels.reschedule import Rescheduled, arguments_of, reschedule, reschedule_many
from ..doctor.finding import Finding
from ..doctor.observe import diagnose
from ..error_groups import ErrorGroup, group_errors, split_error
from ..errors import DelayqError
from ..glue.app_ladder import index_of, ladder_for
from ..glue.integration import install
from ..inputs import BadInput, check_id, check_selection, parse_delay, parse_due, require_selection
from ..ladder.moments import parse_moment
from ..parking.queue import ParkingQueue
from ..parking.record import ParkedFilter, ParkedMessage
from ..index.lookup import find_waiting, waiting_with_passes
from ..index.priority import urgent
from ..pending.browse import Page, Snapshot, WaitingFilter, matching, page_of
from ..pending.reader_process import ReaderProcess
from ..index.query import PendingTask
from ..index.stream import IndexUnavailable
from ..rabbitmq.status import ladder_status
from .schemas import Bulk, DueSoon, Overview
from .settings import WebSettings
from ..typing import CeleryApp

__all__ = ["Service", "ParkedPage", "moment", "describe_parked", "get_service", "ServiceDep"]

log = logging.getLogger("celery_delayq.web")


class Service:
    """The page's view of one Celery app's delayed work."""

    #: Seconds the doctor's findings are reused (it asks every worker, which takes a second).
    DOCTOR_TTL = 30.0

    def __init__(self, app: CeleryApp, settings: WebSettings) -> None:
        self.app = app
        self.settings = settings
        self.context = ladder_for(app)
        # The kept list's reads of the whole index run in a child process: the GIL stays the requests'.
        self.reader = ReaderProcess()
        self.snapshot = Snapshot(app, reader=self.reader)
        self._doctor: tuple[float, list[Finding]] | None = None
        self._groups: tuple[list[PendingTask], WaitingFilter, list[ErrorGroup]] | None = None
        self._lock = threading.Lock()
        self._parking_lock = threading.RLock()

    def close(self) -> None:
        """End what the service keeps running (the reader process); the web app does on shutdown."""
        self.reader.close()

    # -- reading ---------------------------------------------------------------------------------
    def overview(self) -> Overview:
        """``delayq status --json``'s document, what is due soon (None, and why, when the index cannot be
        read) and the last hour of telemetry (None when off)."""
        with self.context.connected() as raw:
            doc = ladder_status(self.context, raw)
        try:
            soon, index_error = self.due_soon(), None
        except IndexUnavailable as exc:
            soon, index_error = None, str(exc)
        root = self.context.config.telemetry_dir
        hour = last_hour(root) if root else None
        return Overview.model_validate({**doc, "due_soon": soon, "index_error": index_error,
                                        "last_hour": hour.as_dict() if hour is not None else None})

    def findings(self) -> list[Finding]:
        """The doctor's findings (reused for :attr:`DOCTOR_TTL` seconds)."""
        with self._lock:
            if self._doctor is not None and time.monotonic() - self._doctor[0] < self.DOCTOR_TTL:
                return self._doctor[1]
        with self.context.connected() as raw:
            found = diagnose(self.context, raw, inspect_timeout=0.5)
        with self._lock:
            self._doctor = (time.monotonic(), found)
        return found

    def due_soon(self, now: float | None = None) -> DueSoon:
        """Waiting tasks due within the next minute and hour (from the index)."""
        now = time.time() if now is None else now
        every, _, _ = self.snapshot.get()
        return DueSoon(next_minute=sum(1 for t in every if now < t.due <= now + 60),
                       next_hour=sum(1 for t in every if now < t.due <= now + 3600),
                       retries=sum(1 for t in every if t.attempt > 0 and t.due > now))

    def waiting(self, match: WaitingFilter, *, offset: int = 0, limit: int = 50) -> Page:
        """One page of waiting tasks."""
        return page_of(self.app, match, offset=offset, limit=limit, snapshot=self.snapshot)

    # A lookup by id is what a person waits for: it runs urgent(), and the kept list's background read of the
    # whole index pauses meanwhile (celery_delayq.index.priority). So do the actions on chosen ids below.
    def detail(self, task_id: str) -> tuple[PendingTask, list[PendingTask]]:
        """The waiting task of this id and every pass of it the index still holds, oldest first (its shard and
        the cancel log are read once, on one connection), or :class:`TaskNotWaiting`."""
        task_id = check_id(task_id, what="task_id")
        with urgent():
            return waiting_with_passes(*index_of(self.app), task_id, now=time.time())

    def error_groups(self, match: WaitingFilter) -> list[ErrorGroup]:
        """The waiting tasks that match grouped by their last error (from the kept list, as a page is; the
        groups of one read of the index are kept with it, so paging does not count them again)."""
        every = self.snapshot.get()[0]
        with self._lock:
            if self._groups is not None and self._groups[0] is every and self._groups[1] == match:
                return self._groups[2]
        found = matching(self.app, match, snapshot=self.snapshot).items
        groups = group_errors(split_error(t.last_error) for t in found if t.last_error)
        with self._lock:
            self._groups = (every, match, groups)
        return groups

    @contextlib.contextmanager
    def parking(self) -> Iterator[ParkingQueue]:
        """The app's parking queue, closed afterwards; one look at a time in this process.

        A look takes every message and hands it back, so two at once would each see only part of the
        queue (two viewers, or the live pages refreshing together): they wait for each other.
        """
        with self._parking_lock, ParkingQueue.for_app(self.app) as pq:
            yield pq

    def parked(self, match: ParkedFilter, *, offset: int = 0, limit: int = 50) -> ParkedPage:
        """One page of the parked messages that match (oldest first), how many match and are parked, and the
        matches grouped by exception class and message pattern.

        The count of matches is what a bulk button confirms (``expect``), so it is the whole
        queue's, not the page's. The queue is read once (as any look at it is).
        """
        with self.parking() as pq:
            found = pq.list(match)
            total = pq.count()
        return ParkedPage(found[offset:offset + limit], len(found), total, offset, limit,
                          group_errors((p.exc_type, p.exc_message) for p in found))

    def parked_one(self, parked_id: str) -> ParkedMessage:
        """One parked message by id (prefix), or :class:`ParkedMessageNotFound`."""
        with self.parking() as pq:
            return pq.get(check_id(parked_id, what="parked_id"))

    # -- acting ----------------------------------------------------------------------------------
    # Every action takes the operator's input as given (text from a form or JSON) and reads it through
    # celery_delayq.inputs here, once, for the page and the API alike; each one, done or refused, logs
    # one audit line (celery_delayq.audit) naming who asked, through what, and which ids.
    def _acting(self) -> None:
        """Install the ladder on the app before the first action: a moved task or a delayed replay is
        published through it, and with ``delayq_telemetry_dir`` set the app's telemetry then records
        this process's replays (workers record the cancelled and superseded copies they drop)."""
        install(self.app)

    @contextlib.contextmanager
    def _audited(self, action: str, who: str, via: str, ids: Sequence[str] = (),
                 **details: Any) -> Iterator[dict[str, Any]]:
        """Audit the action in the ``with`` block: done (the ids the block put in the yielded record) or refused.

        The block sets ``record["dry_run"] = True`` for a count that changes nothing (not audited).
        """
        record: dict[str, Any] = {"ids": list(ids), "dry_run": False, **details}
        try:
            yield record
        except Exception as exc:
            if not record["dry_run"]:
                why = str(exc) if isinstance(exc, (DelayqError, ValueError)) else f"{type(exc).__name__}: {exc}"
                audit(action, who=who, via=via, ids=record.pop("ids"), refused=why,
                      **{k: v for k, v in record.items() if k != "dry_run"})
            raise
        if not record.pop("dry_run"):
            ids_done = record.pop("ids")
            self.snapshot.forget(ids_done)  # gone from the page now; the index is read again
            audit(action, who=who, via=via, ids=ids_done, **record)

    def cancel(self, task_ids: Sequence[str], *, who: str, via: str) -> list[CancelResult]:
        """Cancel tasks by whole id (:func:`celery_delayq.cancel`).

        Every id must name a task waiting now (one read of their index shards and of the cancel log):
        an unknown, ran or already cancelled one is :class:`TaskNotWaiting` and nothing is recorded.
        """
        with self._audited("cancel", who, via, [str(i) for i in task_ids]):
            if not task_ids:
                raise BadInput("task_id: give at least one task id")
            ids = [check_id(i, what="task_id") for i in task_ids]
            self._acting()
            with urgent():
                return cancel(self.app, *ids, only_waiting=True)

    def waiting_filter(self, *, task: str | None = None, queue: str | None = None, id: str | None = None,
                       args: str | None = None, due_after: str | None = None, due_before: str | None = None,
                       retries: bool = False, error: str | None = None, message: str | None = None) -> WaitingFilter:
        """The filter of the waiting list from its fields as typed (blank = not given).

        Raises:
            BadInput: a due time that is not a time (or outside the years 1970-9999).
        """
        def text(value: str | None) -> str | None:
            return value.strip() or None if value is not None else None

        return WaitingFilter(task=text(task), queue=text(queue), id_prefix=text(id), text=text(args),
                             due_after=moment(due_after, "due_after"), due_before=moment(due_before, "due_before"),
                             retries_only=retries, error=text(error), message=text(message))

    def cancel_matching(self, fields: Mapping[str, Any], *, everything: bool, dry_run: bool, expect: int | None,
                        who: str, via: str) -> Bulk:
        """Cancel every waiting task that matches ``fields`` (:meth:`waiting_filter`'s); a dry run only counts.

        Raises:
            BadInput: no filter and not ``everything`` (or both); acting without ``expect``.
            SelectionChanged: the filter now matches another count than ``expect``; nothing is cancelled.
        """
        with self._audited("cancel-matching", who, via) as record:
            found = self._matching_now(record, fields, everything=everything, dry_run=dry_run, expect=expect)
            ids = [t.task_id for t in found]
            if ids and not dry_run:
                self._acting()
                cancel(self.app, *ids, lookup=False)
            return Bulk.of(ids, 0 if dry_run else len(ids), dry_run=dry_run)

    def _matching_now(self, record: dict[str, Any], fields: Mapping[str, Any], *, everything: bool, dry_run: bool,
                      expect: int | None) -> list[PendingTask]:
        """The waiting tasks a bulk action selects, read afresh (never a kept list), held to ``expect``
        unless a dry run; their ids go in the audit ``record`` (and the selection itself)."""
        record["dry_run"] = dry_run
        match = self.waiting_filter(**fields)
        record["filter"] = match.describe() or ("all" if everything else "none")
        require_selection(described=match.describe(), everything=everything, dry_run=dry_run, expect=expect)
        found = matching(self.app, match).items
        if not dry_run:
            check_selection(expect, len(found), "waiting task")
            record["ids"] = [t.task_id for t in found]
        return found

    def reschedule(self, task_id: str, due: str | float | None, *, who: str, via: str) -> Rescheduled:
        """Run now (``due`` None) or move a waiting task to ``due`` (text as typed, or epoch seconds).

        Raises:
            BadInput: a bad id; a due time that is empty, in the past, or not a time (it names run-now).
            DelayTooLong: a due time later than the app accepts.
            TaskNotWaiting, CannotReschedule: see :func:`~celery_delayq.cancels.reschedule.reschedule`.
        """
        with self._audited("run-now" if due is None else "reschedule", who, via, [str(task_id)]) as record:
            task_id = check_id(task_id, what="task_id")
            now = time.time()
            when = self._due(record, due, now)
            self._acting()
            with urgent():
                return reschedule(self.app, task_id, due=when, now=now)

    def move(self, task_ids: Sequence[str], due: str | float | None, *, who: str, via: str) -> Bulk:
        """Run now (``due`` None) or move these waiting tasks (the rows an operator selected).

        Every id must name a task waiting now, and every task's arguments must be rebuildable, or nothing
        is moved (:class:`TaskNotWaiting`, :class:`CannotReschedule`); then each runs once, as
        :meth:`reschedule`.
        """
        with self._audited("run-now" if due is None else "reschedule", who, via, [str(i) for i in task_ids]
                           ) as record:
            if not task_ids:
                raise BadInput("task_id: select at least one task")
            ids = [check_id(i, what="task_id") for i in task_ids]
            now = time.time()
            when = self._due(record, due, now)
            with urgent():
                found = find_waiting(*index_of(self.app), ids, now=time.time())
                return self._move_each([found[i] for i in dict.fromkeys(ids)], when, now)

    def move_matching(self, fields: Mapping[str, Any], due: str | float | None, *, everything: bool,
                      dry_run: bool, expect: int | None, who: str, via: str) -> Bulk:
        """Run now or move every waiting task matching ``fields`` (:meth:`waiting_filter`'s); a dry run only
        counts. Raises as :meth:`cancel_matching`, and as :meth:`move`."""
        with self._audited("run-now" if due is None else "reschedule", who, via) as record:
            found = self._matching_now(record, fields, everything=everything, dry_run=dry_run, expect=expect)
            now = time.time()
            when = self._due(record, due, now)
            if dry_run:
                return Bulk.of([t.task_id for t in found], 0, dry_run=True)
            return self._move_each(found, when, now)

    def _due(self, record: dict[str, Any], due: str | float | None, now: float) -> float | None:
        """The new due time (None: now), read as :meth:`reschedule` reads it, at ``now``.

        A due time is read once, when the action is asked for: "in 3s" means 3 s after the click, and the moves
        check it against that moment, not against the clock after the index was read (which, on a busy broker,
        took longer than 3 s and refused the move as "in the past"). A move that lands after its due time runs at
        once, never early."""
        if due is None:
            return None
        record["due"] = due
        return parse_due(due, now=now, check_delay=self.context.config.check_delay)

    def _move_each(self, found: Sequence[PendingTask], when: float | None, now: float) -> Bulk:
        """Check every task's arguments first (nothing is moved when one cannot be), then move each."""
        for t in found:
            arguments_of(t)
        if found:
            self._acting()
        reschedule_many(self.app, found, due=when, now=now)
        return Bulk.of([t.task_id for t in found], len(found), dry_run=False)

    def parked_filter(self, *, task: str | None = None, exception: str | None = None, message: str | None = None,
                      ids: Sequence[str] = ()) -> ParkedFilter:
        """The parked-message filter from its fields as typed (blank = not given; each id is checked)."""
        return ParkedFilter(task=(task or "").strip() or None, exception=(exception or "").strip() or None,
                            message=(message or "").strip() or None, ids=tuple(check_id(i, what="ids") for i in ids))

    def replay(self, fields: Mapping[str, Any], *, everything: bool, delay: str | float | None, dry_run: bool,
               expect: int | None, who: str, via: str, reset_attempts: bool = False) -> Bulk:
        """Replay the parked messages matching ``fields`` (:meth:`parked_filter`'s), after ``delay``
        (``parse_delay``'s forms; None: now); a dry run only counts them. ``reset_attempts``: the tasks
        start their retries over (the CLI's ``parking replay --reset-attempts``).

        Raises:
            BadInput: as :meth:`cancel_matching`; a bad delay.
            DelayTooLong: a delay longer than the app accepts.
            SelectionChanged: the filter now matches another count than ``expect``.
        """
        with self._audited("replay", who, via) as record:
            record["dry_run"] = dry_run
            match = self.parked_filter(**fields)
            record["filter"] = describe_parked(match) or ("all" if everything else "none")
            seconds = None if delay is None else parse_delay(delay, check_delay=self.context.config.check_delay)
            record["delay"] = seconds
            if reset_attempts:
                record["reset_attempts"] = True
            require_selection(described=describe_parked(match), everything=everything, dry_run=dry_run,
                              expect=expect, noun="parked message")
            self._acting()
            return self._on_parked(record, match, dry_run=dry_run, expect=expect,
                                   act=lambda pq, exact: pq.replay(exact, delay=seconds or None,
                                                                   reset_attempts=reset_attempts).replayed)

    def delete_parked(self, fields: Mapping[str, Any], *, everything: bool, dry_run: bool, expect: int | None,
                      who: str, via: str) -> Bulk:
        """Delete the parked messages matching ``fields`` (no undo); a dry run only counts them.

        Raises:
            BadInput: as :meth:`cancel_matching`.
            SelectionChanged: the filter now matches another count than ``expect``.
        """
        with self._audited("delete-parked", who, via) as record:
            record["dry_run"] = dry_run
            match = self.parked_filter(**fields)
            record["filter"] = describe_parked(match) or ("all" if everything else "none")
            require_selection(described=describe_parked(match), everything=everything, dry_run=dry_run,
                              expect=expect, noun="parked message")
            return self._on_parked(record, match, dry_run=dry_run, expect=expect,
                                   act=lambda pq, exact: pq.purge(exact))

    def _on_parked(self, record: dict[str, Any], match: ParkedFilter, *, dry_run: bool, expect: int | None,
                   act: Callable[[ParkingQueue, ParkedFilter], int]) -> Bulk:
        """What replay and delete share once the selection is checked: count (a dry run stops there), hold
        the count to ``expect``, then ``act`` on exactly the messages counted (one parked since is left alone)."""
        with self.parking() as pq:
            found = [p.parked_id for p in pq.list(match)]
            if dry_run:
                return Bulk.of(found, 0, dry_run=True)
            check_selection(expect, len(found), "parked message")
            record["ids"] = found
            done = act(pq, replace(match, exactly=frozenset(found))) if found else 0
        return Bulk.of(found, done, dry_run=False)


@dataclass(frozen=True)
class ParkedPage:
    """One page of parked messages, how many match the filter and how many are parked, and the matches grouped."""

    items: list[ParkedMessage]
    matched: int
    total: int
    offset: int
    limit: int
    groups: list[ErrorGroup]


def moment(value: str | None, what: str) -> float | None:
    """Epoch seconds of a filter's time (``parse_moment``'s forms; blank: not given), or :class:`BadInput`."""
    if value is None or not value.strip():
        return None
    try:
        return parse_moment(value, direction="ahead")
    except (ValueError, OverflowError, OSError) as exc:
        raise BadInput(f"{what}: {exc}") from None


def describe_parked(match: ParkedFilter) -> str:
    """A parked-message filter in words (``""`` when there is none)."""
    parts = [f"{name} {value}" for name, value in (("--task", match.task), ("--exception", match.exception),
                                                                     ("--message", match.message))
             if value]
    parts += [f"--id {i}" for i in match.ids]
    return " ".join(parts)


def get_service(request: Request) -> Service:
    """The app's :class:`Service` (set by :func:`~celery_delayq.web.create_app`); what a route asks for.

    A test swaps the service for a fake with ``app.dependency_overrides[get_service]``.
    """
    found: Service = request.app.state.delayq
    return found


ServiceDep = Annotated[Service, Depends(get_service)]
