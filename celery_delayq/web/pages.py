"""The HTML views (Overview, Waiting, Retries, Parked) and the browser's action forms.

Pages are server-rendered Jinja2 templates: they work without JavaScript
(the small ``static/delayq.js`` only asks "are you sure?"), load nothing from
another site, and hold at most one page of tasks, never the whole index.
Every form posts with the CSRF token (:mod:`.security`) and comes back to
the page it was sent from with a one-line result. A form's values are read
by the same :class:`~.service.Service` methods as the API's (through
:mod:`celery_delayq.inputs`): a due time in the past is refused naming
run-now, a bulk button sends the count it showed (``expect``) and ``all``
when no filter is set, and a refusal comes back as the page's red line,
having changed nothing. A route takes the service and the caller from
:mod:`.deps`, as the API's routes do, and reads a list's filter through the
same :class:`~.deps.WaitingQuery` and :class:`~.deps.ParkedQuery`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Callable
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from ..errors import DelayqError
from ..inputs import BadInput
from ..ladder.humanize import human_duration
from ..parking import ParkedMessageNotFound
from ..index import IndexUnavailable
from ..pending.browse import WaitingFilter
from .deps import ParkedQuery, ServiceDep, WaitingQuery, Who
from .security import CSRF_FIELD, csrf_token_for
from .service import Service, describe_parked

__all__ = ["router", "templates"]

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.globals["human_duration"] = human_duration
router = APIRouter(include_in_schema=False)
_PAGE = 50


def _render(request: Request, svc: Service, name: str, **context: Any) -> HTMLResponse:
    context.update(request=request, read_only=svc.settings.read_only, csrf=csrf_token_for(request),
                   csrf_field=CSRF_FIELD, message=request.query_params.get("msg"),
                   failed=request.query_params.get("failed") == "1", now=time.time(),
                   prefix=request.scope.get("root_path", ""), body_max=svc.settings.body_max)
    response: HTMLResponse = templates.TemplateResponse(request, name, context)
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = "default-src 'self'; style-src 'self'; img-src 'self' data:"
    return response


def _back(request: Request, message: str, *, failed: bool = False, to: str | None = None) -> Response:
    # Back to the page the form was on: its path and query only, never another host.
    referer = urlsplit(request.headers.get("referer") or "")
    target = to or (f"{referer.path}?{referer.query}" if referer.path.startswith("/") else "") or str(
        request.url_for("overview_page"))
    base, _, query = target.partition("?")
    params = [(k, v) for k, v in (p.split("=", 1) if "=" in p else (p, "") for p in query.split("&") if p)
              if k not in ("msg", "failed")]
    params.append(("msg", message))
    if failed:
        params.append(("failed", "1"))
    return RedirectResponse(f"{base}?{urlencode(params)}", status_code=303)


@router.get("/", response_class=HTMLResponse, name="overview_page")
def overview_page(request: Request, svc: ServiceDep) -> HTMLResponse:
    doc = svc.overview()
    try:
        findings, doctor_error = svc.findings(), None
    except Exception as exc:  # noqa: BLE001 - the doctor's failure is shown, the rest of the page still is
        findings, doctor_error = [], str(exc)
    biggest = max([lv["messages"] for lv in doc.levels] + [1])
    return _render(request, svc, "overview.html", status=doc, soon=doc.due_soon, index_error=doc.index_error,
                   findings=findings, doctor_error=doctor_error, biggest=biggest, tab="overview",
                   hour=doc.last_hour, telemetry_on=bool(svc.context.config.telemetry_dir))


def _list_page(request: Request, svc: Service, q: WaitingQuery, offset: str, *, retries: bool) -> HTMLResponse:
    error = None
    try:
        match = q.filter(svc, retries=retries)
    except BadInput as exc:
        match, q, error = WaitingFilter(retries_only=retries), WaitingQuery(), str(exc)
    try:
        page = svc.waiting(match, offset=int(offset) if offset.strip().isdigit() else 0, limit=_PAGE)
    except IndexUnavailable as exc:
        page, error = None, str(exc)
    query = q.given()
    return _render(request, svc, "waiting.html", page=page, q=q, error=error, retries=retries, query=query,
                   urlencode=urlencode, filtered=bool(query), tab="retries" if retries else "waiting",
                   described=match.describe())


@router.get("/waiting", response_class=HTMLResponse, name="waiting_page")
def waiting_page(request: Request, svc: ServiceDep, q: Annotated[WaitingQuery, Depends()],
                 offset: str = "0") -> HTMLResponse:
    return _list_page(request, svc, q, offset, retries=False)


@router.get("/retries", response_class=HTMLResponse, name="retries_page")
def retries_page(request: Request, svc: ServiceDep, q: Annotated[WaitingQuery, Depends()],
                 offset: str = "0") -> HTMLResponse:
    return _list_page(request, svc, q, offset, retries=True)


@router.get("/parked", response_class=HTMLResponse, name="parked_page")
def parked_page(request: Request, svc: ServiceDep, q: Annotated[ParkedQuery, Depends()]) -> HTMLResponse:
    error = None
    try:
        match = q.filter(svc)
    except BadInput as exc:
        match, q, error = svc.parked_filter(), ParkedQuery(), str(exc)
    found, matched, total = svc.parked(match, limit=_PAGE)
    return _render(request, svc, "parked.html", found=found, matched=matched, total=total, q=q,
                   filtered=bool(describe_parked(match)), tab="parked", error=error)


@router.get("/parked/{parked_id}", response_class=HTMLResponse, name="parked_detail")
def parked_detail(request: Request, svc: ServiceDep, parked_id: str) -> Response:
    try:
        p = svc.parked_one(parked_id)
    except (ParkedMessageNotFound, BadInput) as exc:
        return _render(request, svc, "parked_detail.html", p=None, error=str(exc), tab="parked")
    body = p.body.decode("utf-8", "replace")
    return _render(request, svc, "parked_detail.html", p=p, error=None, tab="parked",
                   body=body[:svc.settings.body_max], body_cut=len(body) > svc.settings.body_max)


# -- actions (POST, CSRF-checked and refused when read-only by the middleware) ------------------------
def _act(request: Request, what: Callable[[], str], *, to: str | None = None) -> Response:
    """Run the action and go back with its one-line result, or with its refusal (nothing was done)."""
    try:
        return _back(request, what(), to=to)
    except DelayqError as exc:  # BadInput, DelayTooLong, not waiting, selection changed...
        return _back(request, str(exc), failed=True)


def _flag(value: str, name: str) -> bool:
    """A form's checkbox or hidden flag: ``1`` (or ``on``, a checkbox's) is set, blank is not, nothing else."""
    if value in ("", "0"):
        return False
    if value in ("1", "on", "true"):
        return True
    raise BadInput(f"{name}: {value[:40]!r} is not a flag; send 1 or leave it out")


def _count(value: str) -> int:
    """The ``expect`` count a bulk button sends (the number it showed)."""
    text = value.strip()
    if not text.isdigit() or len(text) > 12:
        raise BadInput(f"expect: {value[:40]!r} is not a count; reload the page and use its button")
    return int(text)


@router.post("/actions/cancel")
def cancel_action(request: Request, svc: ServiceDep, who: Who, task_id: list[str] = Form([])) -> Response:
    def go() -> str:
        done = svc.cancel(task_id, who=who, via="page")
        return f"cancelled {len(done)} task(s): {', '.join(r.task_id for r in done[:5])}{' …' if len(done) > 5 else ''}"
    return _act(request, go)


@router.post("/actions/run-now")
def run_now_action(request: Request, svc: ServiceDep, who: Who, task_id: str = Form("")) -> Response:
    def go() -> str:
        done = svc.reschedule(task_id, None, who=who, via="page")
        return f"task {done.old.task_id} will run now (its copy in the ladder is cancelled)"
    return _act(request, go)


@router.post("/actions/reschedule")
def reschedule_action(request: Request, svc: ServiceDep, who: Who, task_id: str = Form(""),
                      due: str = Form("")) -> Response:
    def go() -> str:
        done = svc.reschedule(task_id, due, who=who, via="page")
        return f"task {done.old.task_id} now due {done.as_dict()['due']}"
    return _act(request, go)


@router.post("/actions/cancel-matching")
def cancel_matching_action(request: Request, svc: ServiceDep, who: Who, expect: str = Form(""),
                           task: str = Form(""), queue: str = Form(""), id: str = Form(""), args: str = Form(""),
                           due_after: str = Form(""), due_before: str = Form(""), retries: str = Form(""), all: str = Form("")) -> Response:
    def go() -> str:
        done = svc.cancel_matching(dict(task=task, queue=queue, id=id, args=args, due_after=due_after,
                                        due_before=due_before, retries=_flag(retries, "retries")),
                                   everything=_flag(all, "all"), dry_run=False, expect=_count(expect),
                                   who=who, via="page")
        return f"cancelled {done.done} matching task(s)"
    return _act(request, go)


@router.post("/actions/replay")
def replay_action(request: Request, svc: ServiceDep, who: Who, expect: str = Form(""), task: str = Form(""),
                  exception: str = Form(""), parked_id: list[str] = Form([]), delay: str = Form(""),
                  all: str = Form("")) -> Response:
    def go() -> str:
        done = svc.replay(dict(task=task, exception=exception, ids=parked_id), everything=_flag(all, "all"),
                          delay=delay if delay.strip() else None, dry_run=False, expect=_count(expect),
                          who=who, via="page")
        after = f" after {delay.strip()}" if delay.strip() else ""
        return f"replayed {done.done} of {done.matched} parked message(s){after}"
    return _act(request, go)


@router.post("/actions/delete-parked")
def delete_parked_action(request: Request, svc: ServiceDep, who: Who, expect: str = Form(""),
                         task: str = Form(""), exception: str = Form(""), parked_id: list[str] = Form([]),
                         all: str = Form("")) -> Response:
    def go() -> str:
        done = svc.delete_parked(dict(task=task, exception=exception, ids=parked_id), everything=_flag(all, "all"),
                                 dry_run=False, expect=_count(expect), who=who, via="page")
        return f"deleted {done.done} parked message(s)"
    # From a message's own page, back to the list (the message is gone).
    return _act(request, go, to=str(request.url_for("parked_page")) if parked_id else None)
