"""Who may look and who may act: authentication, CSRF, read-only (ASGI middleware and helpers).

* **Authentication**: when a token or a basic-auth user is configured, every
  request but ``/static`` must carry ``Authorization: Bearer TOKEN`` or HTTP
  basic credentials (compared in constant time); otherwise 401. A deployment
  that mounts :func:`~celery_delayq.web.create_app` behind its own auth can
  leave both unset.
* **CSRF**: a browser sends basic credentials (and cookies of a mounting
  site) with any request, including one a hostile page makes it send. So a
  state-changing request (POST, DELETE) must carry the page's CSRF token,
  set as a cookie on every page and repeated in the form field
  ``csrf_token`` or the ``X-CSRF-Token`` header (double submit), unless it
  authenticates with a bearer token, which a browser never adds on its own.
* **Read-only**: every state-changing request is refused (403) and no page
  shows an action.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from typing import Any, Awaitable, Callable, MutableMapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .settings import WebSettings

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "CSRF_HEADER", "SecurityMiddleware", "csrf_token_for"]

CSRF_COOKIE = "delayq_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a.encode(), b.encode())


def authenticated(request: Request, settings: WebSettings) -> str | None:
    """How the request authenticated: ``"token"``, ``"basic"``, ``"none"`` (no auth configured), or None."""
    if not settings.auth_required:
        return "none"
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and settings.token and _same(value.strip(), settings.token):
        return "token"
    if scheme.lower() == "basic" and settings.username and settings.password:
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if _same(user, settings.username) and _same(password, settings.password):
            return "basic"
    return None


def csrf_token_for(request: Request) -> str:
    """The CSRF token of this browser (its cookie), or a new one (set by the middleware)."""
    token = request.cookies.get(CSRF_COOKIE)
    if not token or len(token) < 20:
        token = request.scope.setdefault("delayq.csrf_new", secrets.token_urlsafe(24))
    return token


def _error(status: int, message: str, **headers: str) -> Response:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers or None)


class SecurityMiddleware:
    """ASGI middleware applying the rules of the module docstring."""

    def __init__(self, app: ASGIApp, settings: WebSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        path = scope.get("path", "")
        method = scope["method"]
        if not path.startswith(scope.get("root_path", "") + "/static/"):
            how = authenticated(request, self.settings)
            if how is None:
                challenge = 'Basic realm="delayq"' if self.settings.username else 'Bearer realm="delayq"'
                await _error(401, "authentication required: send Authorization: Bearer TOKEN or basic "
                                  "credentials", **{"WWW-Authenticate": challenge})(scope, receive, send)
                return
            if method not in _SAFE:
                if self.settings.read_only:
                    await _error(403, "this delayq page is read-only (--read-only): no action is allowed")(
                        scope, receive, send)
                    return
                if how != "token" and not await self._csrf_ok(request, scope):
                    await _error(403, "CSRF check failed: a state-changing request from a browser must carry the "
                                      "page's csrf_token (form field or X-CSRF-Token header) matching its "
                                      f"{CSRF_COOKIE} cookie; reload the page and try again")(scope, receive, send)
                    return
        body_read = "delayq.body" in scope
        await self.app(scope, _replay_body(scope) if body_read else receive, self._with_cookie(scope, send))

    async def _csrf_ok(self, request: Request, scope: Scope) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE)
        given = request.headers.get(CSRF_HEADER)
        if given is None and request.headers.get("content-type", "").startswith(
                ("application/x-www-form-urlencoded", "multipart/form-data")):
            body = await request.body()
            scope["delayq.body"] = body
            form = await request.form()
            value = form.get(CSRF_FIELD)
            given = value if isinstance(value, str) else None
        elif "delayq.body" not in scope:
            scope["delayq.body"] = await request.body()
        return _same(cookie, given)

    def _with_cookie(self, scope: Scope, send: Any) -> Any:
        async def wrapped(message: Any) -> None:
            new = scope.get("delayq.csrf_new")
            if message["type"] == "http.response.start" and new:
                path = scope.get("root_path", "") or "/"
                cookie = f"{CSRF_COOKIE}={new}; Path={path}; SameSite=Strict; HttpOnly"
                message.setdefault("headers", []).append((b"set-cookie", cookie.encode("latin-1")))
            await send(message)
        return wrapped


def _replay_body(scope: Scope) -> Any:
    """A ``receive`` that hands the app the body the CSRF check already read."""
    body = scope.get("delayq.body")
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        return {"type": "http.disconnect"}
    return receive
