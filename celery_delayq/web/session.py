"""A browser's login in token mode: the token, typed once, traded for a signed session cookie.

The cookie (:data:`SESSION_COOKIE`) holds ``v1.EXPIRES.NONCE.SIGNATURE``, an HMAC-SHA256 under a key derived
from a secret of this process and the token, never the token itself: a new token, a restart, the expiry
(:data:`SESSION_TTL_S`) or logging out ends a session. Everything is compared in constant time; a client that
fails :attr:`Sessions.FAILS_ALLOWED` logins in a minute is refused (429). docs/web.md, "Security".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time

from starlette.requests import Request

from .settings import WebSettings

__all__ = ["Sessions", "SESSION_COOKIE", "SESSION_TTL_S", "sessions_of", "safe_next"]

SESSION_COOKIE = "delayq_session"
#: How long a login lasts.
SESSION_TTL_S = 12 * 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Sessions:
    """Issues and checks session cookies for ``settings.token`` (none without a token)."""

    def __init__(self, settings: WebSettings, ttl_s: float = SESSION_TTL_S) -> None:
        self.settings = settings
        self.ttl_s = ttl_s
        secret = secrets.token_bytes(32)
        token = (settings.token or "").encode()
        self._key = hmac.new(secret, b"delayq session\0" + token, hashlib.sha256).digest() if token else b""
        self._revoked: dict[str, float] = {}
        self._fails: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Is there a token to log in with?"""
        return bool(self._key)

    def token_ok(self, typed: str) -> bool:
        """Is ``typed`` the token (constant time)?"""
        token = self.settings.token
        return bool(token) and hmac.compare_digest(typed.strip().encode(), (token or "").encode())

    #: Failed logins one client may make per :attr:`FAIL_WINDOW_S` before it is refused without a check.
    FAILS_ALLOWED = 5
    FAIL_WINDOW_S = 60.0

    def throttled(self, client: str, now: float | None = None) -> bool:
        """Has ``client`` failed :attr:`FAILS_ALLOWED` logins within the last :attr:`FAIL_WINDOW_S` seconds?"""
        now = time.time() if now is None else now
        with self._lock:
            recent = [t for t in self._fails.get(client, []) if t > now - self.FAIL_WINDOW_S]
            self._fails[client] = recent
            return len(recent) >= self.FAILS_ALLOWED

    def failed(self, client: str, now: float | None = None) -> None:
        """Count a failed login of ``client`` (the oldest clients are forgotten past 10,000)."""
        with self._lock:
            if len(self._fails) > 10_000:
                self._fails.clear()
            self._fails.setdefault(client, []).append(time.time() if now is None else now)

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, now: float | None = None) -> str:
        """A new cookie value, valid for :attr:`ttl_s`."""
        if not self.enabled:
            raise ValueError("no token configured: there is nothing to log in with")
        expires = int((time.time() if now is None else now) + self.ttl_s)
        payload = f"v1.{expires}.{secrets.token_urlsafe(18)}"
        return f"{payload}.{self._sign(payload)}"

    def valid(self, value: str | None, now: float | None = None) -> bool:
        """Is ``value`` a cookie this process issued, unexpired and not logged out?"""
        if not value or not self.enabled or len(value) > 200:
            return False
        payload, _, signature = value.rpartition(".")
        parts = payload.split(".")
        if len(parts) != 3 or parts[0] != "v1" or not parts[1].isdigit():
            return False
        if not hmac.compare_digest(signature.encode(), self._sign(payload).encode()):
            return False
        now = time.time() if now is None else now
        with self._lock:
            return int(parts[1]) > now and parts[2] not in self._revoked

    def revoke(self, value: str | None, now: float | None = None) -> None:
        """Log this cookie out (its nonce is refused until it would have expired anyway)."""
        if not self.valid(value, now):
            return
        _, expires, nonce = (value or "").rpartition(".")[0].split(".")
        now = time.time() if now is None else now
        with self._lock:
            self._revoked = {n: e for n, e in self._revoked.items() if e > now}
            self._revoked[nonce] = float(expires)

    def cookie(self, value: str, *, path: str, secure: bool) -> str:
        """The ``Set-Cookie`` value carrying ``value``."""
        return (f"{SESSION_COOKIE}={value}; Path={path or '/'}; Max-Age={int(self.ttl_s)}; HttpOnly; "
                f"SameSite=Strict{'; Secure' if secure else ''}")

    @staticmethod
    def clear(*, path: str, secure: bool) -> str:
        """The ``Set-Cookie`` value that removes the cookie."""
        return (f"{SESSION_COOKIE}=; Path={path or '/'}; Max-Age=0; HttpOnly; "
                f"SameSite=Strict{'; Secure' if secure else ''}")


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
