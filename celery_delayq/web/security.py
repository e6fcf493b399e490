"""Who may look and who may act: authentication, CSRF, read-only, the body limit (ASGI middleware and helpers).

Bearer token, basic auth or the token's session cookie (else 401, or the login form for a page); a browser's
write needs the CSRF token (double submit) unless it uses a bearer token; read-only refuses every write (403);
:class:`BodyLimit` answers 413 before parsing; :func:`actor` names the caller for the audit line. docs/web.md.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from urllib.parse import urlencode
from typing import Any, Awaitable, Callable, MutableMapping

from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from ..audit import token_fingerprint
from .session import SESSION_COOKIE, Sessions
from .settings import WebSettings, is_loopback

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "CSRF_HEADER", "SecurityMiddleware", "BodyLimit", "csrf_token_for", "actor",
           "how_authenticated", "OPEN_PATHS"]

CSRF_COOKIE = "delayq_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a.encode(), b.encode())


#: Paths (under the root path) served without authentication: the login form and logout.
OPEN_PATHS = ("/login", "/logout")
_HOW = "delayq.how"


def authenticated(request: Request, settings: WebSettings, sessions: Sessions | None = None) -> str | None:
    """How the request authenticated: ``"token"``, ``"basic"``, ``"session"`` (the cookie of a browser that
    logged in with the token), ``"none"`` (no auth configured), or None."""
    if not settings.auth_required:
        return "none"
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and settings.token and _same(value.strip(), settings.token):
        return "token"
    if scheme.lower() == "basic" and settings.username and settings.password:
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
            if _same(user, settings.username) and _same(password, settings.password):
                return "basic"
        except (binascii.Error, UnicodeDecodeError):
            pass
    # Last: a cookie comes with every request a browser sends, so its writes need the CSRF token.
    if sessions is not None and sessions.valid(request.cookies.get(SESSION_COOKIE)):
        return "session"
    return None


def csrf_token_for(request: Request) -> str:
    """The CSRF token of this browser (its cookie), or a new one (set by the middleware)."""
    token = request.cookies.get(CSRF_COOKIE)
    if not token or len(token) < 20:
        token = request.scope.setdefault("delayq.csrf_new", secrets.token_urlsafe(24))
    return token


def how_authenticated(request: Request) -> str | None:
    """How this request authenticated (set by :class:`SecurityMiddleware`; None on an open path)."""
    how = request.scope.get(_HOW)
    return str(how) if how else None


def actor(request: Request) -> str:
    """Who sent this request, as the audit line names them (set by :class:`SecurityMiddleware`)."""
    return str(request.scope.get(_WHO) or _who(request, None, "none"))


_WHO = "delayq.who"


def _who(request: Request, settings: WebSettings | None, how: str) -> str:
    if how in ("token", "session") and settings is not None and settings.token:
        return token_fingerprint(settings.token)
    if how == "basic" and settings is not None:
        return f"user:{settings.username}"
    host = request.client.host if request.client else ""
    return "loopback" if is_loopback(host) else f"unauthenticated:{host or '?'}"


def _error(status: int, message: str, **headers: str) -> Response:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers or None)


class SecurityMiddleware:
    """ASGI middleware applying the rules of the module docstring."""

    def __init__(self, app: ASGIApp, settings: WebSettings, sessions: Sessions | None = None) -> None:
        self.app = app
        self.settings = settings
        self.sessions = sessions

    def _login_redirect(self, request: Request, root: str) -> Response | None:
        """A browser asking for a page in token mode goes to the login form; anything else gets its 401."""
        wants_page = request.method in ("GET", "HEAD") and "text/html" in request.headers.get("accept", "")
        path = request.url.path[len(root):] if request.url.path.startswith(root) else request.url.path
        if not (wants_page and self.sessions is not None and self.sessions.enabled) or path.startswith("/api/"):
            return None
        back = path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{root}/login?{urlencode({'next': back})}", status_code=303)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        root = scope.get("root_path", "")
        path = scope.get("path", "")
        method = scope["method"]
        open_path = path in tuple(root + p for p in OPEN_PATHS)
        if not path.startswith(root + "/static/"):
            how = "open" if open_path else authenticated(request, self.settings, self.sessions)
            if how is None:
                redirect = self._login_redirect(request, root)
                if redirect is not None:
                    await redirect(scope, receive, self._with_cookie(scope, send))
                    return
                challenge = 'Basic realm="delayq"' if self.settings.username else 'Bearer realm="delayq"'
                await _error(401, "authentication required: send Authorization: Bearer TOKEN or basic "
                                  "credentials" + (f", or log in at {root}/login" if self.sessions is not None and
                                                   self.sessions.enabled else ""),
                             **{"WWW-Authenticate": challenge})(scope, receive, send)
                return
            scope[_HOW] = None if open_path else how
            scope[_WHO] = _who(request, self.settings, how)
            if method not in _SAFE:
                if self.settings.read_only and not open_path:
                    await _error(403, "this delayq page is read-only (--read-only): no action is allowed")(
                        scope, receive, send)
                    return
                try:
                    csrf_ok = how == "token" or await self._csrf_ok(request, scope)
                except _BadForm as exc:
                    await _error(400, str(exc))(scope, receive, send)
                    return
                if not csrf_ok:
                    await _error(403, "CSRF check failed: a state-changing request from a browser must carry the "
                                      "page's csrf_token (form field or X-CSRF-Token header) matching its "
                                      f"{CSRF_COOKIE} cookie; reload the page and try again")(scope, receive, send)
                    return
        read_here = scope.pop("delayq.read_here", False)
        await self.app(scope, _replay_body(scope, receive) if read_here else receive, self._with_cookie(scope, send))

    async def _csrf_ok(self, request: Request, scope: Scope) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE)
        given = request.headers.get(CSRF_HEADER)
        if given is None and request.headers.get("content-type", "").startswith(
                ("application/x-www-form-urlencoded", "multipart/form-data")):
            if "delayq.body" not in scope:  # not behind BodyLimit: read it here, and hand it on
                scope["delayq.body"] = await request.body()
                scope["delayq.read_here"] = True
            parsed = Request(scope, _replay_body(scope, request.receive))
            try:
                # Each field is capped at the body limit, and the parts' count at starlette's defaults.
                async with parsed.form(max_part_size=self.settings.body_limit) as form:
                    value = form.get(CSRF_FIELD)
            except (MultiPartException, HTTPException, ValueError, KeyError, UnicodeDecodeError) as exc:
                # The client's form, not this server, is broken: a 400 naming why, no traceback.
                why = exc.detail if isinstance(exc, HTTPException) else str(exc) or type(exc).__name__
                raise _BadForm(f"malformed form body: {why}; send "
                               "application/x-www-form-urlencoded or multipart/form-data as a browser does") from None
            given = value if isinstance(value, str) else None
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


class _BadForm(ValueError):
    """The CSRF check could not parse the request's form."""


def _replay_body(scope: Scope, receive: Any) -> Any:
    """A ``receive`` that hands the app the body already read once, then the server's own (a disconnect)."""
    body = scope.get("delayq.body")
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        return await receive()
    return replay


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before anything parses it.

    The body is read here, counting, and handed on from memory, so no route,
    form parser or CSRF check ever holds more than ``limit`` bytes of one request.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _too_large(self, size: str) -> Response:
        return _error(413, f"request body of {size} bytes is over the limit of {self.limit} bytes "
                           "(delayq_web_body_limit)", Connection="close")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Request(scope).headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await _error(400, f"Content-Length: {declared[:40]!r} is not a number of bytes")(scope, receive, send)
                return
            if int(declared) > self.limit:
                await self._too_large(declared.strip())(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:  # a chunked (or lying) body: stop reading at the first byte over
                await self._too_large(f"more than {self.limit}")(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        scope["delayq.body"] = b"".join(chunks)
        await self.app(scope, _replay_body(scope, receive), send)
