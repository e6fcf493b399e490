"""The HTML views (Overview, Waiting, Retries, Parked, a page per waiting and parked task) and the browser's
action forms (docs/web.md describes the pages).

Server-rendered Jinja2 templates that work without JavaScript and hold at most one page of tasks (its
``offset`` and ``limit`` in the address). Every form posts with the CSRF token (:mod:`.security`), is read by
the same :class:`~.service.Service` methods as the API's, and comes back to its page with a one-line result
(a refusal, having changed nothing, as the red line). Routes take the service, the caller and a list's filter
from :mod:`.deps`, as the API's routes do.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Annotated, Any, Callable
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from ..errors import DelayqError
from ..inputs import BadInput, SelectionChanged
from ..ladder.humanize import human_duration
from ..parking.errors import ParkedMessageNotFound
from ..error_groups import ErrorGroup
from ..index import IndexUnavailable, TaskNotWaiting
from ..index.query import iso
from ..pending.browse import WaitingFilter
from .deps import ParkedForm, ParkedQuery, WaitingForm, WaitingQuery, Who, count, flag
from .security import CSRF_FIELD, csrf_token_for
from .session import SESSION_COOKIE, Sessions, safe_next, sessions_of
from .service import Service, ServiceDep, describe_parked, moment

__all__ = ["router", "templates"]

log = logging.getLogger("celery_delayq.web")

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


def _when(epoch: float | None) -> str:
    """A time as the page writes it: absolute (UTC) with how long from now beside it."""
    if epoch is None:
        return "now"
    ahead = epoch - time.time()
    rel = f"in {human_duration(ahead)}" if ahead >= 0 else f"{human_duration(-ahead)} ago"
    return f"{iso(epoch)[:19].replace('T', ' ')} UTC ({rel})"


templates.env.globals.update(human_duration=human_duration, when=_when, urlencode=urlencode)
router = APIRouter(include_in_schema=False)
_PAGE = 50


def _render(request: Request, svc: Service, name: str, **context: Any) -> HTMLResponse:
    if isinstance(context.get("error"), str):
        context["error"] = for_page(context["error"])
    context.update(request=request, read_only=svc.settings.read_only, csrf=csrf_token_for(request),
                   csrf_field=CSRF_FIELD, message=request.query_params.get("msg"),
                   failed=request.query_params.get("failed") == "1", now=time.time(),
                   prefix=request.scope.get("root_path", ""), body_max=svc.settings.body_max)
    response: HTMLResponse = templates.TemplateResponse(request, name, context)
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = "default-src 'self'; style-src 'self'; img-src 'self' data:"
    return response


#: What a refusal written for the command line says differently on the page.
_CLI_WORDS = ((re.compile(r"`celery -A APP (delayq [^`]*)`"), r"`\1` on the command line"),
              (re.compile(r"[;,]? *`delayq pending --id` lists what waits"), ""))


def for_page(text: str) -> str:
    """A message in the page's words: no ``celery -A APP`` (the page knows its app), no pointers to listing
    commands (the page lists)."""
    for pattern, words in _CLI_WORDS:
        text = pattern.sub(words, text)
    return text


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


#: The page sizes offered (each at most ``delayq_web_page_max``); any other size typed in the address is kept.
PAGE_SIZES = (20, 50, 100, 200)


def _paging(request: Request, svc: Service) -> tuple[int, int]:
    """``offset`` and ``limit`` from the address (a bookmark): a bad or missing one is the first page of 50."""
    def number(name: str, default: int) -> int:
        text = request.query_params.get(name, "").strip()
        return int(text) if text.isdigit() and len(text) < 9 else default
    return number("offset", 0), max(1, min(number("limit", _PAGE), svc.settings.page_max))


def _list_page(request: Request, svc: Service, q: WaitingQuery, *, retries: bool) -> HTMLResponse:
    error = None
    try:
        match = q.filter(svc, retries=retries)
    except BadInput as exc:
        match, q, error = WaitingFilter(retries_only=retries), WaitingQuery(), str(exc)
    offset, limit = _paging(request, svc)
    groups: list[ErrorGroup] = []
    try:
        page = svc.waiting(match, offset=offset, limit=limit)
        groups = svc.error_groups(match) if retries else []
    except IndexUnavailable as exc:
        page, error = None, str(exc)
    query = q.given()
    return _render(request, svc, "waiting.html", page=page, q=q, error=error, retries=retries, query=query,
                   filtered=bool(query), tab="retries" if retries else "waiting", groups=groups,
                   described=in_words(query), paging=_pager(page.total if page else 0, offset, limit, query))


@router.get("/waiting", response_class=HTMLResponse, name="waiting_page")
def waiting_page(request: Request, svc: ServiceDep, q: Annotated[WaitingQuery, Depends()]) -> HTMLResponse:
    return _list_page(request, svc, q, retries=False)


@router.get("/retries", response_class=HTMLResponse, name="retries_page")
def retries_page(request: Request, svc: ServiceDep, q: Annotated[WaitingQuery, Depends()]) -> HTMLResponse:
    return _list_page(request, svc, q, retries=True)


@router.get("/waiting/{task_id}", response_class=HTMLResponse, name="waiting_detail")
def waiting_detail(request: Request, svc: ServiceDep, task_id: str) -> Response:
    try:
        t, passes = svc.detail(task_id)
    except (TaskNotWaiting, BadInput) as exc:
        gone = isinstance(exc, TaskNotWaiting)
        return _render(request, svc, "waiting_detail.html", t=None, tab="waiting", error=(
            f"Task {task_id[:80]} is not waiting in the ladder: it ran, was cancelled or moved, or the id is "
            "wrong." if gone else str(exc)))
    return _render(request, svc, "waiting_detail.html", t=t, passes=passes, error=None,
                   tab="retries" if t.attempt else "waiting")


@router.get("/parked", response_class=HTMLResponse, name="parked_page")
def parked_page(request: Request, svc: ServiceDep, q: Annotated[ParkedQuery, Depends()]) -> HTMLResponse:
    error = None
    try:
        match = q.filter(svc)
    except BadInput as exc:
        match, q, error = svc.parked_filter(), ParkedQuery(), str(exc)
    offset, limit = _paging(request, svc)
    found = svc.parked(match, offset=offset, limit=limit)
    query = q.given()
    return _render(request, svc, "parked.html", found=found, q=q, query=query, filtered=bool(describe_parked(match)),
                   tab="parked", error=error, described=in_words(query),
                   paging=_pager(found.matched, offset, limit, query))


@router.get("/parked/{parked_id}", response_class=HTMLResponse, name="parked_detail")
def parked_detail(request: Request, svc: ServiceDep, parked_id: str) -> Response:
    try:
        p = svc.parked_one(parked_id)
    except (ParkedMessageNotFound, BadInput) as exc:
        gone = isinstance(exc, ParkedMessageNotFound)
        return _render(request, svc, "parked_detail.html", p=None, tab="parked", error=(
            f"No parked task has an id starting with {parked_id[:80]}: it was replayed or deleted, or the id is "
            "wrong (or it starts more than one id)." if gone else str(exc)))
    body = p.body.decode("utf-8", "replace")
    return _render(request, svc, "parked_detail.html", p=p, error=None, tab="parked",
                   body=body[:svc.settings.body_max], body_cut=len(body) > svc.settings.body_max,
                   headers=p.to_dict(with_body=True)["headers"])


#: The filter fields in the page's words (no command-line flags).
_WORDS = {"id": "id starting with", "args": "arguments containing", "task": "task", "queue": "queue",
          "due_after": "due after", "due_before": "due before", "error": "error", "exception": "exception",
          "message": "message"}


def in_words(query: dict[str, str]) -> str:
    """A list's filter as the page says it: ``task proj.* and arguments containing "1012"``."""
    return " and ".join(f"{_WORDS.get(k, k)} “{v}”" for k, v in query.items())


def _pager(total: int, offset: int, limit: int, query: dict[str, str]) -> dict[str, Any]:
    """The links of a list's pager: first, previous, up to 7 page numbers around this one, next, last, sizes."""
    def href(start: int, size: int = limit) -> str:
        return "?" + urlencode({**query, "offset": start, "limit": size})

    pages = max(1, -(-total // limit))
    here = min(offset // limit, pages - 1)
    numbers = range(max(0, min(here - 3, pages - 7)), min(pages, max(here - 3, 0) + 7))
    return {"pages": pages, "here": here + 1, "total": total, "shown_from": min(offset + 1, total),
            "shown_to": min(offset + limit, total), "first": href(0), "last": href((pages - 1) * limit),
            "prev": href(max(offset - limit, 0)) if offset > 0 else None,
            "next": href(offset + limit) if offset + limit < total else None,
            "numbers": [(n + 1, href(n * limit), n == here) for n in numbers],
            "sizes": [(n, href(0, n), n == limit) for n in PAGE_SIZES]}


# -- actions (POST, CSRF-checked and refused when read-only by the middleware) ------------------------
def _act(request: Request, what: Callable[[], str], *, to: str | None = None) -> Response:
    """Run the action and go back with its one-line result, or with its refusal (nothing was done)."""
    try:
        return _back(request, what(), to=to)
    except SelectionChanged as exc:
        return _back(request, f"Nothing was done: the selection now matches {exc.matched:,}, not the {exc.expect:,} "
                              "shown when you confirmed. The page shows the new count; check it and try again.",
                     failed=True)
    except DelayqError as exc:  # BadInput, DelayTooLong, not waiting...
        return _back(request, for_page(str(exc)), failed=True)


@router.post("/actions/cancel")
def cancel_action(request: Request, svc: ServiceDep, who: Who, task_id: list[str] = Form([])) -> Response:
    def go() -> str:
        done = svc.cancel(task_id, who=who, via="page")
        ids = ", ".join(r.task_id for r in done[:5]) + (" …" if len(done) > 5 else "")
        return f"Cancelled {_n(len(done), 'task')} ({ids}); {'it' if len(done) == 1 else 'they'} will not run."
    return _act(request, go)


@router.post("/actions/run-now")
def run_now_action(request: Request, svc: ServiceDep, who: Who, task_id: str = Form("")) -> Response:
    def go() -> str:
        done = svc.reschedule(task_id, None, who=who, via="page")
        return f"Task {done.old.task_id} will run now (once: its copy in the ladder is cancelled)."
    return _act(request, go)


@router.post("/actions/reschedule")
def reschedule_action(request: Request, svc: ServiceDep, who: Who, task_id: str = Form(""),
                      due: str = Form("")) -> Response:
    def go() -> str:
        done = svc.reschedule(task_id, due, who=who, via="page")
        return f"Task {done.old.task_id} is now due {_when(done.due)}."
    return _act(request, go)


@router.post("/actions/cancel-matching")
def cancel_matching_action(request: Request, svc: ServiceDep, who: Who,
                           form: Annotated[WaitingForm, Depends()]) -> Response:
    def go() -> str:
        done = svc.cancel_matching(form.fields(), everything=flag(form.all, "all"), dry_run=False,
                                   expect=count(form.expect), who=who, via="page")
        return f"Cancelled {_n(done.done, 'task')}; they will not run."
    return _act(request, go)


@router.post("/actions/move")
def move_action(request: Request, svc: ServiceDep, who: Who, form: Annotated[WaitingForm, Depends()],
                task_id: list[str] = Form([]), due: str = Form(""), now: str = Form("")) -> Response:
    """Run now (``now``) or move to ``due``: the selected rows (``task_id``), or every task the filter matches."""
    def go() -> str:
        when = None if flag(now, "now") else due
        if task_id:
            done = svc.move(task_id, when, who=who, via="page")
        else:
            done = svc.move_matching(form.fields(), when, everything=flag(form.all, "all"), dry_run=False,
                                     expect=count(form.expect), who=who, via="page")
        return (f"{_n(done.done, 'task')} will run now" if when is None else
                f"Moved {_n(done.done, 'task')} to {_when(moment(due, 'due'))}") + "; each runs once."
    return _act(request, go)


@router.post("/actions/replay")
def replay_action(request: Request, svc: ServiceDep, who: Who, form: Annotated[ParkedForm, Depends()],
                  delay: str = Form(""), reset_attempts: str = Form("")) -> Response:
    def go() -> str:
        reset = flag(reset_attempts, "reset_attempts")
        done = svc.replay(form.fields(), **form.selection(), delay=delay if delay.strip() else None,
                          reset_attempts=reset, who=who, via="page")
        after = f" to run in {delay.strip()}" if delay.strip() else ""
        missed = f" ({done.matched - done.done} could not be sent back and are still parked)" if done.done < done.matched else ""
        return (f"Replayed {_n(done.done, 'parked task')}{after}{missed}"
                + ("; their retries start over." if reset else "."))
    return _act(request, go, to=_parked_list(request))


@router.post("/actions/delete-parked")
def delete_parked_action(request: Request, svc: ServiceDep, who: Who,
                         form: Annotated[ParkedForm, Depends()]) -> Response:
    def go() -> str:
        done = svc.delete_parked(form.fields(), **form.selection(), who=who, via="page")
        return f"Deleted {_n(done.done, 'parked task')}."
    return _act(request, go, to=_parked_list(request))


def _parked_list(request: Request) -> str | None:
    """From a parked task's own page, back to the list (the task is gone); from the list, back to it."""
    referer = urlsplit(request.headers.get("referer") or "").path
    return None if referer.rstrip("/").endswith("/parked") else str(request.url_for("parked_page"))


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


# -- logging in with the token (token mode): /login and /logout, open to anyone (security.OPEN_PATHS) --------
# GET /login shows the form; POST /login (CSRF-checked like every form) compares the token in constant time
# and sets the session cookie (.session), then goes back to the page asked for (a path of this site only);
# POST /logout revokes the cookie and clears it. Scripts keep Authorization: Bearer; basic auth needs no form.
def _login_form(request: Request, svc: Service, next: str, error: str | None = None) -> HTMLResponse:
    return _render(request, svc, "login.html", tab="login", next=safe_next(next), error=error,
                   token_mode=sessions_of(request).enabled,
                   basic=bool(svc.settings.username and svc.settings.password))


@router.get("/login", name="login_page")
def login_page(request: Request, svc: ServiceDep, next: str = "/") -> Response:
    return _login_form(request, svc, next)


@router.post("/login", name="login")
def login(request: Request, svc: ServiceDep, token: str = Form(""), next: str = Form("/")) -> Response:
    sessions = sessions_of(request)
    root = request.scope.get("root_path", "")
    client = request.client.host if request.client else "?"
    throttled = sessions.throttled(client)
    if throttled or not sessions.enabled or not sessions.token_ok(token):
        why = ("too many failed logins" if throttled else "no token is configured" if not sessions.enabled
               else "wrong token")
        log.warning("delayq web: a login from %s was refused (%s)", client, why)
        if not throttled:
            sessions.failed(client)
        page = _login_form(request, svc, next, f"{sessions.FAILS_ALLOWED} failed logins within a minute: wait a "
                           "minute, then try again." if throttled else "That is not the token." if sessions.enabled
                           else "This page has no token to log in with.")
        page.status_code = 429 if throttled else 401
        return page
    log.info("delayq web: %s logged in with the token", client)
    response = RedirectResponse(root + safe_next(next), status_code=303)
    response.headers.append("set-cookie", sessions.cookie(sessions.issue(), path=root or "/",
                                                          secure=request.url.scheme == "https"))
    return response


@router.post("/logout", name="logout")
def logout(request: Request) -> Response:
    sessions = sessions_of(request)
    sessions.revoke(request.cookies.get(SESSION_COOKIE))
    root = request.scope.get("root_path", "")
    response = RedirectResponse(f"{root}/login?msg=logged+out", status_code=303)
    response.headers.append("set-cookie", Sessions.clear(path=root or "/", secure=request.url.scheme == "https"))
    return response
