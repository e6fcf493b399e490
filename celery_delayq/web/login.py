"""``/login`` and ``/logout``: a browser's way in when the page is served with a token.

``GET /login`` shows a form for the token; ``POST /login`` (CSRF-checked like
every form) compares it in constant time and, when it is the token, sets the
session cookie (:mod:`.session`) and goes back to the page asked for (a path
of this site only). ``POST /logout`` revokes the cookie and clears it. A
script keeps sending ``Authorization: Bearer``; basic auth needs no form (the
browser asks).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from .deps import ServiceDep
from .pages import _render
from .session import SESSION_COOKIE, Sessions

__all__ = ["router", "sessions_of", "safe_next"]

router = APIRouter(include_in_schema=False)
log = logging.getLogger("celery_delayq.web")


def sessions_of(request: Request) -> Sessions:
    """The app's :class:`Sessions` (set by :func:`~celery_delayq.web.create_app`)."""
    found: Sessions = request.app.state.delayq_sessions
    return found


def safe_next(value: str | None) -> str:
    """Where to go after logging in: a path of this site (``/...``), never another host; else the overview."""
    value = (value or "").strip()
    if not value.startswith("/") or value.startswith("//") or "\\" in value or any(c < " " for c in value):
        return "/"
    return value[:2000]


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


@router.get("/login", name="login_page")
def login_page(request: Request, svc: ServiceDep, next: str = "/") -> Response:
    sessions = sessions_of(request)
    return _render(request, svc, "login.html", tab="login", next=safe_next(next), error=None,
                   token_mode=sessions.enabled, basic=bool(svc.settings.username and svc.settings.password))


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
        page = _render(request, svc, "login.html", tab="login", next=safe_next(next), token_mode=sessions.enabled,
                       basic=bool(svc.settings.username and svc.settings.password),
                       error=f"{sessions.FAILS_ALLOWED} failed logins within a minute: wait a minute, then try "
                             "again." if throttled else "That is not the token." if sessions.enabled else
                       "This page has no token to log in with.")
        page.status_code = 429 if throttled else 401
        return page
    log.info("delayq web: %s logged in with the token", request.client.host if request.client else "?")
    response = RedirectResponse(root + safe_next(next), status_code=303)
    response.headers.append("set-cookie", sessions.cookie(sessions.issue(), path=root or "/",
                                                          secure=_secure(request)))
    return response


@router.post("/logout", name="logout")
def logout(request: Request) -> Response:
    sessions = sessions_of(request)
    sessions.revoke(request.cookies.get(SESSION_COOKIE))
    root = request.scope.get("root_path", "")
    response = RedirectResponse(f"{root}/login?msg=logged+out", status_code=303)
    response.headers.append("set-cookie", Sessions.clear(path=root or "/", secure=_secure(request)))
    return response
