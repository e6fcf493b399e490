"""``/api/waiting``: the tasks waiting in the ladder; cancel, run now or move one, cancel every match."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from ..deps import Limit, Offset, TaskId, WaitingQuery, Who
from ..service import ServiceDep
from ..errors import READ, READ_ONE, WRITE
from ..schemas import (Bulk, CancelFilter, Cancelled, ErrorGroupOut, Moved, MoveFilter, MoveSelected, NewDue, Pass,
                       Waiting, WaitingDetail, WaitingPage)

__all__ = ["router"]

router = APIRouter(prefix="/api/waiting", tags=["waiting"])


# Fixed paths (/cancel, /groups, /move, /move-selected) are declared before the id path it also fits (/{task_id}): the router tries
# routes in order.
@router.get("", responses=READ, summary="Waiting tasks, soonest first")
def waiting(svc: ServiceDep, q: Annotated[WaitingQuery, Depends()], limit: Limit,
            offset: Offset = 0, retries: bool = Query(False, description="Only retries.")) -> WaitingPage:
    """One page of the tasks waiting in the ladder that match every filter given."""
    page = svc.waiting(q.filter(svc, retries=retries), offset=offset, limit=limit)
    return WaitingPage.of(page, body_max=svc.settings.body_max)


@router.post("/cancel", responses=WRITE, summary="Cancel every matching task")
def cancel_matching(svc: ServiceDep, who: Who, body: CancelFilter) -> Bulk:
    """Count (``dry_run``, the default) or cancel every waiting task matching the filter (or ``all``)."""
    return svc.cancel_matching(body.fields(), **body.how(), who=who, via="api")


@router.get("/groups", responses=READ, summary="Waiting tasks grouped by their last error")
def error_groups(svc: ServiceDep, q: Annotated[WaitingQuery, Depends()],
                 retries: bool = Query(True, description="Only retries.")) -> list[ErrorGroupOut]:
    """The matching tasks (retries by default) by last exception class, then by message pattern, most first."""
    return [ErrorGroupOut.model_validate(g, from_attributes=True) for g in svc.error_groups(q.filter(svc, retries=retries))]


@router.post("/move", responses=WRITE, summary="Run now or move every matching task")
def move_matching(svc: ServiceDep, who: Who, body: MoveFilter) -> Bulk:
    """Count (``dry_run``, the default) or run now (no ``due``) or move to ``due`` every waiting task matching
    the filter (or ``all``); each runs once. Nothing is moved when one's arguments cannot be rebuilt (409)."""
    return svc.move_matching(body.fields(), body.due, **body.how(), who=who, via="api")


@router.post("/move-selected", responses=WRITE, summary="Run now or move these tasks")
def move_selected(svc: ServiceDep, who: Who, body: MoveSelected) -> Bulk:
    """Run now (no ``due``) or move to ``due`` these waiting tasks; one not waiting: 404 and none is moved."""
    return svc.move(body.ids, body.due, who=who, via="api")


@router.get("/{task_id}", responses=READ_ONE, summary="One waiting task, with its passes through the ladder")
def waiting_one(svc: ServiceDep, task_id: TaskId) -> WaitingDetail:
    """The waiting task of this id and every pass of it the index still holds (one index shard is read)."""
    found, passes = svc.detail(task_id)
    one = Waiting.of(found, body_max=svc.settings.body_max)
    return WaitingDetail(**one.model_dump(), last_traceback=found.last_traceback,
                         passes=[Pass.of(t) for t in passes])


@router.post("/{task_id}/cancel", responses=WRITE, summary="Cancel one task")
def cancel_one(svc: ServiceDep, who: Who, task_id: TaskId) -> Cancelled:
    """Cancel this task: it will not run (recorded in the cancel log, confirmed). Unknown: 404, nothing recorded."""
    return Cancelled.model_validate(svc.cancel([task_id], who=who, via="api")[0].as_dict())


@router.post("/{task_id}/run-now", responses=WRITE, summary="Run one task now")
def run_now(svc: ServiceDep, who: Who, task_id: TaskId) -> Moved:
    """Publish the task again to run now and cancel its copy in the ladder: it runs once."""
    return Moved.model_validate(svc.reschedule(task_id, None, who=who, via="api").as_dict())


@router.post("/{task_id}/reschedule", responses=WRITE, summary="Move one task to a new due time")
def reschedule_one(svc: ServiceDep, who: Who, body: NewDue, task_id: TaskId) -> Moved:
    """Publish the task again with the new due time and cancel its copy in the ladder: it runs once.

    The due time must be in the future (400 otherwise, naming run-now) and within the app's
    longest delay (422, ``DelayTooLong``).
    """
    return Moved.model_validate(svc.reschedule(task_id, body.due, who=who, via="api").as_dict())
