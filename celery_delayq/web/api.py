"""The JSON API (``/api/...``), documented at ``/api/openapi.json``.

FastAPI validates every parameter against the types declared here, so bad
input (an unknown field, a negative offset, a page larger than
``delayq_web_page_max``, a time that is not a time) is a 4xx with a JSON
body, never a 500; the package's own errors are mapped in :func:`install_errors`.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from ..cancels.supersede import CannotReschedule, TaskNotWaiting
from ..errors import DelayqError
from ..parking import ParkedFilter, ParkedMessageNotFound
from ..pending import IndexUnavailable
from ..pending.browse import WaitingFilter
from .service import Service, pending_dict

__all__ = ["router", "install_errors", "parse_time", "BadInput"]

router = APIRouter(prefix="/api")


class BadInput(ValueError):
    """A parameter that passed its type but means nothing (a bad time, a bad glob)."""


def parse_time(value: str | None, name: str) -> float | None:
    """Epoch seconds of an API time: the CLI's one rule (ISO 8601, no offset = UTC; epoch seconds; from now: ``10m``)."""
    from ..ladder.moments import parse_moment

    if value is None or value == "":
        return None
    try:
        return parse_moment(value, direction="ahead")
    except (ValueError, OverflowError, OSError) as exc:
        raise BadInput(f"{name}: {exc}") from None


def service(request: Request) -> Service:
    """The app's :class:`Service` (set by :func:`~celery_delayq.web.create_app`)."""
    found: Service = request.app.state.delayq
    return found


class Error(BaseModel):
    """Every 4xx/5xx answer."""

    error: str
    status: int


class Waiting(BaseModel):
    """A waiting task."""

    task_id: str
    task: str | None
    exchange: str
    routing_key: str
    queue: str | None
    due: str
    attempt: int
    args: str | None
    kwargs: str | None
    last_error: str | None
    in_s: float
    retry: bool


class WaitingPage(BaseModel):
    """One page of waiting tasks, soonest due first."""

    total: int
    offset: int
    limit: int
    read_s: float
    items: list[Waiting]


class CancelFilter(BaseModel):
    """Cancel every waiting task that matches (``dry_run``: count only)."""

    model_config = ConfigDict(extra="forbid")
    task: str | None = Field(None, max_length=500)
    queue: str | None = Field(None, max_length=500)
    id: str | None = Field(None, max_length=200)
    args: str | None = Field(None, max_length=500)
    due_after: str | None = Field(None, max_length=100)
    due_before: str | None = Field(None, max_length=100)
    retries: bool = False
    dry_run: bool = True
    expect: int | None = Field(None, ge=0, description="The count the operator confirmed (from a dry run).")


class NewDue(BaseModel):
    """When the task should now run."""

    model_config = ConfigDict(extra="forbid")
    due: str = Field(..., max_length=100, description="ISO 8601 (UTC unless offset) or from now: 90s, 10m, 2h.")


class ParkedSelect(BaseModel):
    """Which parked messages (``dry_run``: count only)."""

    model_config = ConfigDict(extra="forbid")
    task: str | None = Field(None, max_length=500)
    exception: str | None = Field(None, max_length=500)
    ids: list[str] = Field(default_factory=list, max_length=1000)
    delay: float | None = Field(None, ge=0, le=10 * 365 * 86400)
    dry_run: bool = True


class Bulk(BaseModel):
    """What a bulk action matched and did."""

    matched: int
    done: int
    dry_run: bool
    ids: list[str]


_ERRORS: dict[int | str, dict[str, Any]] = {400: {"model": Error}, 404: {"model": Error}, 409: {"model": Error},
                                             422: {"model": Error}, 503: {"model": Error}}


def _filter(task: str | None, queue: str | None, id: str | None, args: str | None, due_after: str | None,
            due_before: str | None, retries: bool) -> WaitingFilter:
    return WaitingFilter(task=task or None, queue=queue or None, id_prefix=id or None, text=args or None,
                         due_after=parse_time(due_after, "due_after"), due_before=parse_time(due_before, "due_before"),
                         retries_only=retries)


@router.get("/overview", responses=_ERRORS, summary="The ladder: counts, levels, leaders, due soon")
def overview(request: Request) -> dict[str, Any]:
    """``delayq status --json`` plus the tasks due in the next minute and hour (and retries waiting)."""
    svc = service(request)
    doc = svc.status()
    try:
        doc["due_soon"] = svc.due_soon()
    except IndexUnavailable as exc:
        doc["due_soon"] = None
        doc["index_error"] = str(exc)
    hour = svc.telemetry()
    doc["last_hour"] = hour.as_dict() if hour is not None else None
    return doc


@router.get("/doctor", responses=_ERRORS, summary="The doctor's findings")
def doctor(request: Request) -> list[dict[str, Any]]:
    """What ``delayq doctor --json`` says."""
    return [f.as_dict() for f in service(request).findings()]


@router.get("/waiting", response_model=WaitingPage, responses=_ERRORS, summary="Waiting tasks, soonest first")
def waiting(request: Request,
            task: str | None = Query(None, max_length=500, description="Glob on the task name."),
            queue: str | None = Query(None, max_length=500),
            id: str | None = Query(None, max_length=200, description="Task id or its start."),
            args: str | None = Query(None, max_length=500, description="Substring of the arguments."),
            due_after: str | None = Query(None, max_length=100), due_before: str | None = Query(None, max_length=100),
            retries: bool = Query(False, description="Only retries."),
            offset: int = Query(0, ge=0, le=10_000_000), limit: int = Query(50, ge=1)) -> dict[str, Any]:
    """One page of the tasks waiting in the ladder that match every filter given."""
    svc = service(request)
    if limit > svc.settings.page_max:
        raise HTTPException(400, f"limit: at most {svc.settings.page_max} per page")
    page = svc.waiting(_filter(task, queue, id, args, due_after, due_before, retries), offset=offset, limit=limit)
    now = time.time()
    return {"total": page.total, "offset": page.offset, "limit": page.limit, "read_s": round(page.read_s, 3),
            "items": [pending_dict(t, now, body_max=svc.settings.body_max) for t in page.items]}


@router.get("/waiting/{task_id}", response_model=Waiting, responses=_ERRORS, summary="One waiting task")
def waiting_one(request: Request, task_id: str) -> dict[str, Any]:
    """The waiting task of this id (one index shard is read)."""
    from ..cancels.supersede import read_index_one

    svc = service(request)
    now = time.time()
    return pending_dict(read_index_one(svc.app, task_id, now=now), now, body_max=svc.settings.body_max)


@router.post("/waiting/{task_id}/cancel", responses=_ERRORS, summary="Cancel one task")
def cancel_one(request: Request, task_id: str) -> dict[str, Any]:
    """Cancel this task: it will not run (recorded in the cancel log, confirmed)."""
    from ..cancels.supersede import read_index_one

    svc = service(request)
    read_index_one(svc.app, task_id, now=time.time())  # unknown id: 404, nothing recorded
    result = svc.cancel([task_id], via="api")[0]
    out: dict[str, Any] = result.as_dict()
    return out


@router.post("/waiting/{task_id}/run-now", responses=_ERRORS, summary="Run one task now")
def run_now(request: Request, task_id: str) -> dict[str, Any]:
    """Publish the task again to run now and cancel its copy in the ladder: it runs once."""
    return service(request).reschedule(task_id, None, via="api").as_dict()


@router.post("/waiting/{task_id}/reschedule", responses=_ERRORS, summary="Move one task to a new due time")
def reschedule_one(request: Request, task_id: str, body: NewDue) -> dict[str, Any]:
    """Publish the task again with the new due time and cancel its copy in the ladder: it runs once."""
    due = parse_time(body.due, "due")
    return service(request).reschedule(task_id, due, via="api").as_dict()


@router.post("/waiting/cancel", response_model=Bulk, responses=_ERRORS, summary="Cancel every matching task")
def cancel_matching(request: Request, body: CancelFilter) -> dict[str, Any]:
    """Count (``dry_run``, the default) or cancel every waiting task matching the filter."""
    match = _filter(body.task, body.queue, body.id, body.args, body.due_after, body.due_before, body.retries)
    if not body.dry_run and body.expect is None:
        raise HTTPException(400, "expect: give the count a dry run returned, to confirm what is cancelled")
    return service(request).cancel_matching(match, dry_run=body.dry_run, expect=body.expect, via="api").as_dict()


def parked_dict(p: Any, body_max: int, *, full: bool = False) -> dict[str, Any]:
    """A parked message for the API (body cut at ``body_max``)."""
    doc: dict[str, Any] = p.to_dict(with_body=full)
    if full:
        body = doc.get("body") or ""
        doc["body_truncated"] = len(body) > body_max
        doc["body"] = body[:body_max]
        doc["headers"] = {k: v for k, v in doc["headers"].items()}
    doc["traceback"] = (doc.get("traceback") or "")[: max(body_max, 4096)]
    return doc


@router.get("/parked", responses=_ERRORS, summary="Parked messages, oldest first")
def parked(request: Request, task: str | None = Query(None, max_length=500),
           exception: str | None = Query(None, max_length=500), id: str | None = Query(None, max_length=200),
           limit: int = Query(50, ge=1)) -> dict[str, Any]:
    """Parked messages matching every filter given (the queue is left as it was)."""
    svc = service(request)
    if limit > svc.settings.page_max:
        raise HTTPException(400, f"limit: at most {svc.settings.page_max} per page")
    found, total = svc.parked(ParkedFilter(task=task or None, exception=exception or None,
                                           ids=(id,) if id else ()), limit=limit)
    return {"total": total, "items": [parked_dict(p, svc.settings.body_max) for p in found]}


@router.get("/parked/{parked_id}", responses=_ERRORS, summary="One parked message, with body and headers")
def parked_one(request: Request, parked_id: str) -> dict[str, Any]:
    """The parked message whose id starts with ``parked_id`` (body cut at ``delayq_web_body_max``)."""
    svc = service(request)
    return parked_dict(svc.parked_one(parked_id), svc.settings.body_max, full=True)


@router.delete("/parked/{parked_id}", response_model=Bulk, responses=_ERRORS, summary="Delete one parked message")
def parked_delete_one(request: Request, parked_id: str) -> dict[str, Any]:
    """Delete this parked message (no undo)."""
    svc = service(request)
    found = svc.parked_one(parked_id)
    return svc.delete_parked(ParkedFilter(ids=(found.parked_id,)), dry_run=False, via="api").as_dict()


def _parked_filter(body: ParkedSelect) -> ParkedFilter:
    return ParkedFilter(task=body.task or None, exception=body.exception or None, ids=tuple(i for i in body.ids if i))


@router.post("/parked/replay", response_model=Bulk, responses=_ERRORS, summary="Replay matching parked messages")
def parked_replay(request: Request, body: ParkedSelect) -> dict[str, Any]:
    """Count (``dry_run``, the default) or replay the matching parked messages, after ``delay`` seconds."""
    return service(request).replay(_parked_filter(body), delay=body.delay, dry_run=body.dry_run,
                                   via="api").as_dict()


@router.post("/parked/delete", response_model=Bulk, responses=_ERRORS, summary="Delete matching parked messages")
def parked_delete(request: Request, body: ParkedSelect) -> dict[str, Any]:
    """Count (``dry_run``, the default) or delete the matching parked messages (no undo)."""
    return service(request).delete_parked(_parked_filter(body), dry_run=body.dry_run, via="api").as_dict()


def _json(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def install_errors(app: FastAPI) -> None:
    """Map bad input and the package's errors to 4xx JSON (and a broker that is down to 503)."""
    import amqp
    import kombu.exceptions

    async def not_found(_: Request, exc: Exception) -> JSONResponse:
        return _json(404, str(exc))

    async def conflict(_: Request, exc: Exception) -> JSONResponse:
        return _json(409, str(exc))

    async def bad(_: Request, exc: Exception) -> JSONResponse:
        return _json(400, str(exc))

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        errors: list[dict[str, Any]] = getattr(exc, "errors", lambda: [])()
        text = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors)
        return _json(422, text or "invalid request")

    async def http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return _json(exc.status_code, str(exc.detail))

    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        return _json(503, f"the broker or the index is not available: {exc}")

    app.add_exception_handler(TaskNotWaiting, not_found)
    app.add_exception_handler(ParkedMessageNotFound, not_found)
    app.add_exception_handler(CannotReschedule, conflict)
    app.add_exception_handler(BadInput, bad)
    app.add_exception_handler(ValueError, bad)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    app.add_exception_handler(IndexUnavailable, unavailable)
    app.add_exception_handler(DelayqError, conflict)
    for cls in (OSError, kombu.exceptions.OperationalError, amqp.exceptions.AMQPError):
        app.add_exception_handler(cls, unavailable)
