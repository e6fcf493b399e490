"""The JSON API (``/api/...``), documented at ``/api/openapi.json``.

FastAPI validates every parameter against the types declared here (JSON
booleans are strict: ``"false"`` is not ``false``), and every value an
action acts on is then read by :mod:`celery_delayq.inputs` through the
:class:`~.service.Service`, the same way the page's forms and the CLI read
it. Bad input is a 4xx with ``{"error": ..., "status": ...}`` and changes
nothing; every route declares its answers (:data:`_READ`, :data:`_WRITE`)
and its response model, so the OpenAPI document is the contract a fuzzer
(schemathesis, in the tests) checks.

======  =====================================================================
Status  When
======  =====================================================================
400     a value that passed its type but means nothing: a due time that is
        empty, in the past or not a time (names ``run-now``), a bad id, a bulk
        action without a filter or ``all`` or without ``expect``; a malformed form
401     authentication is configured and missing or wrong
403     read-only, or a browser's write without the CSRF token
404     no such waiting task or parked message
405     a method the path does not take
409     a bulk action whose filter now matches another count than ``expect``
        (nothing was done); a task whose arguments cannot be moved
413     a request body over ``delayq_web_body_limit`` (1 MiB)
422     a request that does not fit its schema; a due time or delay beyond the
        app's longest (``DelayTooLong``)
503     the broker or the index is not available
======  =====================================================================
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.exceptions import HTTPException

from ..cancels.supersede import CannotReschedule, TaskNotWaiting
from ..errors import DelayqError, DelayTooLong
from ..inputs import DELAY_FORMS, DUE_FORMS, ID_MAX, BadInput, check_id
from ..parking import ParkedMessageNotFound
from ..pending import IndexUnavailable, TaskIdNotFound
from .security import actor
from .service import SelectionChanged, Service, pending_dict

__all__ = ["router", "install_errors", "service"]

router = APIRouter(prefix="/api")


def service(request: Request) -> Service:
    """The app's :class:`Service` (set by :func:`~celery_delayq.web.create_app`)."""
    found: Service = request.app.state.delayq
    return found


class Error(BaseModel):
    """Every 4xx/5xx answer: what was wrong (naming the field) and the status; nothing was changed."""

    error: str
    status: int


def _answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": Error} for code in codes}


#: What a read can answer besides 200.
_READ = _answers(400, 401, 405, 422, 503)
#: ... a read of one id.
_READ_ONE = _answers(400, 401, 404, 405, 422, 503)
#: What an action can answer besides 200.
_WRITE = _answers(400, 401, 403, 404, 405, 409, 413, 422, 503)

_TaskId = Path(..., min_length=1, max_length=ID_MAX, description="A task id (Celery's UUID).")
_ParkedId = Path(..., min_length=1, max_length=ID_MAX, description="A parked id, or its start.")


# -- answers ---------------------------------------------------------------------------------------
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


class DueSoon(BaseModel):
    """Waiting tasks due within the next minute and hour, and retries waiting."""

    next_minute: int
    next_hour: int
    retries: int


class Totals(BaseModel):
    """Messages in the ladder, parked, unroutable, held (None: the management API was not reachable)."""

    model_config = ConfigDict(extra="allow")
    waiting: int
    parked: int
    unroutable: int
    held: int | None


class Overview(BaseModel):
    """``delayq status --json``'s document, plus what is due soon and the last hour of telemetry."""

    model_config = ConfigDict(extra="allow")
    schema_: int = Field(alias="schema", description="The document's version.")
    observed_at: str
    broker: str
    ladder: dict[str, Any]
    exists: bool
    complete: bool
    missing: list[str]
    totals: Totals
    levels: list[dict[str, Any]]
    parking: dict[str, Any]
    unroutable: dict[str, Any]
    next_due_by: str | None
    all_due_by: str | None
    due_soon: DueSoon | None
    index_error: str | None = None
    last_hour: dict[str, Any] | None


class Finding(BaseModel):
    """One of the doctor's findings."""

    check: str
    status: str = Field(description="ok, warn or error")
    summary: str
    next_step: str
    details: dict[str, Any]


class Cancelled(BaseModel):
    """A cancel recorded (``delayq cancel --json``'s object)."""

    task_id: str
    given: str
    until: str | None
    waiting: bool
    task: str | None
    due: str | None


class Moved(BaseModel):
    """A task run now or moved to a new due time (it runs once, with the same id)."""

    task_id: str
    task: str | None
    was_due: str
    due: str | None
    run_now: bool


class Parked(BaseModel):
    """A parked message (without its body)."""

    parked_id: str
    parked_at: float | None
    reason: str
    task: str
    task_id: str
    attempts: int
    first_attempt: float | None
    last_attempt: float | None
    exc_type: str
    exc_message: str
    traceback: str
    exchange: str
    routing_key: str


class ParkedDetail(Parked):
    """A parked message with its headers, properties and body (cut at ``delayq_web_body_max``)."""

    headers: dict[str, Any]
    properties: dict[str, Any]
    body: str
    body_truncated: bool


class ParkedList(BaseModel):
    """Parked messages matching the filter (oldest first, at most ``limit``)."""

    total: int = Field(description="Messages parked in all.")
    matched: int = Field(description="Messages matching the filter.")
    items: list[Parked]


class Bulk(BaseModel):
    """What a bulk action matched and did (nothing on a dry run)."""

    matched: int
    done: int
    dry_run: bool
    ids: list[str] = Field(description="The first 100 ids matched.")


# -- requests --------------------------------------------------------------------------------------
_Text = Field(None, max_length=500)
_EXPECT = Field(None, ge=0, description="To act (dry_run false): the count a dry run returned. When the "
                                        "selection now matches another count, nothing is done (409).")
_ALL = Field(False, description="Select every one, explicitly; an empty filter never means everything. "
                                "Not with a filter.")


class CancelFilter(BaseModel):
    """Cancel every waiting task that matches (``dry_run``, the default: count only).

    A filter (at least one field) or ``all: true`` is required; acting needs ``expect``.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"task": "proj.tasks.*", "args": "customer-42"}, {"task": "proj.tasks.report", "dry_run": False, "expect": 3}]})
    task: StrictStr | None = Field(None, max_length=500, description="Glob on the task name.")
    queue: StrictStr | None = _Text
    id: StrictStr | None = Field(None, max_length=ID_MAX, description="Task id or its start.")
    args: StrictStr | None = Field(None, max_length=500, description="Substring of the arguments.")
    due_after: StrictStr | None = Field(None, max_length=100)
    due_before: StrictStr | None = Field(None, max_length=100)
    retries: StrictBool = Field(False, description="Only retries (a filter by itself).")
    all: StrictBool = _ALL
    dry_run: StrictBool = True
    expect: StrictInt | None = _EXPECT

    def fields(self) -> dict[str, Any]:
        """The filter's fields, for :meth:`Service.cancel_matching`."""
        return dict(task=self.task, queue=self.queue, id=self.id, args=self.args, due_after=self.due_after,
                    due_before=self.due_before, retries=self.retries)


class NewDue(BaseModel):
    """When the task should now run: strictly in the future (to run it now, use run-now)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"due": "10m"},
                                                                          {"due": "2030-01-01T09:00:00"}]})
    due: StrictStr = Field(..., max_length=100, description=DUE_FORMS)


class ParkedSelect(BaseModel):
    """Which parked messages (``dry_run``, the default: count only).

    A filter (task, exception or ids) or ``all: true`` is required; acting needs ``expect``.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"exception": "*Timeout"}, {"all": True, "dry_run": False, "expect": 2}]})
    task: StrictStr | None = Field(None, max_length=500, description="Glob on the task name.")
    exception: StrictStr | None = Field(None, max_length=500, description="Glob on the exception type.")
    ids: list[StrictStr] = Field(default_factory=list, max_length=1000, description="Parked ids (or their start).")
    all: StrictBool = _ALL
    dry_run: StrictBool = True
    expect: StrictInt | None = _EXPECT

    def fields(self) -> dict[str, Any]:
        """The filter's fields, for the service."""
        return dict(task=self.task, exception=self.exception, ids=self.ids)


class ParkedReplay(ParkedSelect):
    """Which parked messages to replay, and after how long."""

    delay: StrictFloat | StrictInt | StrictStr | None = Field(
        None, description=f"{DELAY_FORMS}; none: now.")


# -- routes ----------------------------------------------------------------------------------------
# A fixed path (/waiting/cancel, /parked/replay) is declared before the id path it also fits
# (/waiting/{task_id}): the router tries routes in order.
@router.get("/overview", response_model=Overview, response_model_by_alias=True, responses=_READ,
            summary="The ladder: counts, levels, leaders, due soon")
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


@router.get("/doctor", response_model=list[Finding], responses=_READ, summary="The doctor's findings")
def doctor(request: Request) -> list[dict[str, Any]]:
    """What ``delayq doctor --json`` says."""
    return [f.as_dict() for f in service(request).findings()]


@router.get("/waiting", response_model=WaitingPage, responses=_READ, summary="Waiting tasks, soonest first")
def waiting(request: Request,
            task: str | None = Query(None, max_length=500, description="Glob on the task name."),
            queue: str | None = Query(None, max_length=500),
            id: str | None = Query(None, max_length=ID_MAX, description="Task id or its start."),
            args: str | None = Query(None, max_length=500, description="Substring of the arguments."),
            due_after: str | None = Query(None, max_length=100), due_before: str | None = Query(None, max_length=100),
            retries: bool = Query(False, description="Only retries."),
            offset: int = Query(0, ge=0, le=10_000_000),
            limit: int = Query(50, ge=1, description="At most delayq_web_page_max (500).")) -> dict[str, Any]:
    """One page of the tasks waiting in the ladder that match every filter given."""
    svc = service(request)
    if limit > svc.settings.page_max:
        raise BadInput(f"limit: {limit} is more than {svc.settings.page_max} per page (delayq_web_page_max)")
    match = svc.waiting_filter(task=task, queue=queue, id=id, args=args, due_after=due_after, due_before=due_before,
                               retries=retries)
    page = svc.waiting(match, offset=offset, limit=limit)
    now = time.time()
    return {"total": page.total, "offset": page.offset, "limit": page.limit, "read_s": round(page.read_s, 3),
            "items": [pending_dict(t, now, body_max=svc.settings.body_max) for t in page.items]}


@router.post("/waiting/cancel", response_model=Bulk, responses=_WRITE, summary="Cancel every matching task")
def cancel_matching(request: Request, body: CancelFilter) -> dict[str, Any]:
    """Count (``dry_run``, the default) or cancel every waiting task matching the filter (or ``all``)."""
    return service(request).cancel_matching(body.fields(), everything=body.all, dry_run=body.dry_run,
                                            expect=body.expect, who=actor(request), via="api").as_dict()


@router.get("/waiting/{task_id}", response_model=Waiting, responses=_READ_ONE, summary="One waiting task")
def waiting_one(request: Request, task_id: str = _TaskId) -> dict[str, Any]:
    """The waiting task of this id (one index shard is read)."""
    from ..cancels.supersede import read_index_one

    svc = service(request)
    now = time.time()
    found = read_index_one(svc.app, check_id(task_id, what="task_id"), now=now)
    return pending_dict(found, now, body_max=svc.settings.body_max)


@router.post("/waiting/{task_id}/cancel", response_model=Cancelled, responses=_WRITE, summary="Cancel one task")
def cancel_one(request: Request, task_id: str = _TaskId) -> dict[str, Any]:
    """Cancel this task: it will not run (recorded in the cancel log, confirmed). Unknown: 404, nothing recorded."""
    result = service(request).cancel([task_id], who=actor(request), via="api")[0]
    out: dict[str, Any] = result.as_dict()
    return out


@router.post("/waiting/{task_id}/run-now", response_model=Moved, responses=_WRITE, summary="Run one task now")
def run_now(request: Request, task_id: str = _TaskId) -> dict[str, Any]:
    """Publish the task again to run now and cancel its copy in the ladder: it runs once."""
    return service(request).reschedule(task_id, None, who=actor(request), via="api").as_dict()


@router.post("/waiting/{task_id}/reschedule", response_model=Moved, responses=_WRITE,
             summary="Move one task to a new due time")
def reschedule_one(request: Request, body: NewDue, task_id: str = _TaskId) -> dict[str, Any]:
    """Publish the task again with the new due time and cancel its copy in the ladder: it runs once.

    The due time must be in the future (400 otherwise, naming run-now) and within the app's
    longest delay (422, ``DelayTooLong``).
    """
    return service(request).reschedule(task_id, body.due, who=actor(request), via="api").as_dict()


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


@router.get("/parked", response_model=ParkedList, responses=_READ, summary="Parked messages, oldest first")
def parked(request: Request, task: str | None = Query(None, max_length=500),
           exception: str | None = Query(None, max_length=500), id: str | None = Query(None, max_length=ID_MAX),
           limit: int = Query(50, ge=1, description="At most delayq_web_page_max (500).")) -> dict[str, Any]:
    """Parked messages matching every filter given (the queue is left as it was)."""
    svc = service(request)
    if limit > svc.settings.page_max:
        raise BadInput(f"limit: {limit} is more than {svc.settings.page_max} per page (delayq_web_page_max)")
    match = svc.parked_filter(task=task, exception=exception, ids=[id] if id else [])
    found, matched, total = svc.parked(match, limit=limit)
    return {"total": total, "matched": matched, "items": [parked_dict(p, svc.settings.body_max) for p in found]}


@router.post("/parked/replay", response_model=Bulk, responses=_WRITE, summary="Replay matching parked messages")
def parked_replay(request: Request, body: ParkedReplay) -> dict[str, Any]:
    """Count (``dry_run``, the default) or replay the matching parked messages, after ``delay``."""
    return service(request).replay(body.fields(), everything=body.all, delay=body.delay, dry_run=body.dry_run,
                                   expect=body.expect, who=actor(request), via="api").as_dict()


@router.post("/parked/delete", response_model=Bulk, responses=_WRITE, summary="Delete matching parked messages")
def parked_delete(request: Request, body: ParkedSelect) -> dict[str, Any]:
    """Count (``dry_run``, the default) or delete the matching parked messages (no undo)."""
    return service(request).delete_parked(body.fields(), everything=body.all, dry_run=body.dry_run,
                                          expect=body.expect, who=actor(request), via="api").as_dict()


@router.get("/parked/{parked_id}", response_model=ParkedDetail, responses=_READ_ONE,
            summary="One parked message, with body and headers")
def parked_one(request: Request, parked_id: str = _ParkedId) -> dict[str, Any]:
    """The parked message whose id starts with ``parked_id`` (body cut at ``delayq_web_body_max``)."""
    svc = service(request)
    return parked_dict(svc.parked_one(check_id(parked_id, what="parked_id")), svc.settings.body_max, full=True)


@router.delete("/parked/{parked_id}", response_model=Bulk, responses=_WRITE, summary="Delete one parked message")
def parked_delete_one(request: Request, parked_id: str = _ParkedId) -> dict[str, Any]:
    """Delete this parked message (no undo)."""
    svc = service(request)
    found = svc.parked_one(check_id(parked_id, what="parked_id"))
    return svc.delete_parked({"ids": [found.parked_id]}, everything=False, dry_run=False, expect=1,
                             who=actor(request), via="api").as_dict()


def _json(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


def _allowed(request: Request) -> str:
    """Every method of the path a 405 answers (Starlette names only the first route's: GET, not GET and DELETE)."""
    from starlette.routing import Route

    path = request.scope.get("path", "")
    routes = [r for r in request.app.routes if isinstance(r, Route) and r.path_regex.match(path)]
    if not routes:
        return ""
    first = routes[0].path  # the route the router would pick, and its siblings of the same path
    methods = {m for r in routes if r.path == first for m in (r.methods or ())}
    return ", ".join(sorted(methods))


def install_errors(app: FastAPI) -> None:
    """Map bad input and the package's errors to 4xx JSON (and a broker that is down to 503)."""
    from ..rabbitmq.client import CONNECTION_ERRORS, AMQPError

    def answer(status: int) -> Any:
        async def handler(_: Request, exc: Exception) -> JSONResponse:
            return _json(status, str(exc))
        return handler

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        errors: list[dict[str, Any]] = getattr(exc, "errors", lambda: [])()
        text = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors)
        return _json(422, text or "invalid request")

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(request)
        return _json(exc.status_code, str(exc.detail), headers)

    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        return _json(503, f"the broker or the index is not available: {exc}")

    app.add_exception_handler(TaskNotWaiting, answer(404))
    app.add_exception_handler(TaskIdNotFound, answer(404))
    app.add_exception_handler(ParkedMessageNotFound, answer(404))
    app.add_exception_handler(CannotReschedule, answer(409))
    app.add_exception_handler(SelectionChanged, answer(409))
    app.add_exception_handler(DelayTooLong, answer(422))
    app.add_exception_handler(BadInput, answer(400))
    app.add_exception_handler(ValueError, answer(400))
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    app.add_exception_handler(IndexUnavailable, unavailable)
    app.add_exception_handler(DelayqError, answer(409))
    for cls in (*CONNECTION_ERRORS, AMQPError):
        app.add_exception_handler(cls, unavailable)
