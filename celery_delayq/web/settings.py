"""The web page's settings: from the app's ``delayq_web_*`` settings, then the environment (docs/web.md,
"Security", has the table).

Secrets (a token, a basic-auth password) come from settings or the environment, never from the command
line, where ``ps`` would show them; one shorter than :data:`SECRET_MIN` characters is refused
(:class:`WeakSecret`): a guessable secret on a page that cancels production work is no authentication.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..config import raw_setting
from ..errors import DelayqError
from ..typing import CeleryApp

__all__ = ["WebSettings", "UnsafeBinding", "WeakSecret", "BadWebSetting", "is_loopback", "SECRET_MIN",
           "BODY_LIMIT"]

#: The fewest characters a web token or password may have.
SECRET_MIN = 16
#: The default largest request body, in bytes (1 MiB).
BODY_LIMIT = 1024 * 1024


class UnsafeBinding(DelayqError):
    """Serving beyond loopback without authentication was asked for."""


class BadWebSetting(DelayqError, ValueError):
    """A ``delayq_web_*`` setting (or ``DELAYQ_WEB_*`` variable) that cannot be used; the message is one line."""


class WeakSecret(BadWebSetting):
    """A web token or password shorter than :data:`SECRET_MIN` characters."""


def is_loopback(address: str) -> bool:
    """Is ``address`` (an IP or ``localhost``) only reachable from this host?"""
    if address in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost: may resolve anywhere
        return False


@dataclass(frozen=True)
class WebSettings:
    """How the page authenticates and what it may show and do."""

    token: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    read_only: bool = False
    body_max: int = 4096
    page_max: int = 500
    body_limit: int = BODY_LIMIT
    #: Signs nothing: the CSRF token is a random per-process value compared to the form's copy.
    csrf_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    def __post_init__(self) -> None:
        """Refuse a short secret and a limit that is not a positive number, before anything is served."""
        for what, value, setting in (("token", self.token, "delayq_web_token / DELAYQ_WEB_TOKEN"),
                                     ("password", self.password, "delayq_web_password / DELAYQ_WEB_PASSWORD")):
            if value is not None and len(value) < SECRET_MIN:
                raise WeakSecret(f"{setting}: the web {what} has {len(value)} character(s); give at least "
                                 f"{SECRET_MIN} (e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')")
        for name, number in (("body_limit", self.body_limit), ("body_max", self.body_max),
                             ("page_max", self.page_max)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise BadWebSetting(f"delayq_web_{name}: {number!r} is not a positive whole number")

    @property
    def auth_required(self) -> bool:
        """Is any authentication configured?"""
        return bool(self.token or (self.username and self.password))

    @classmethod
    def from_app(cls, app: CeleryApp, *, read_only: bool = False, environ: dict[str, str] | None = None,
                 **overrides: Any) -> "WebSettings":
        """Settings of ``app`` (``delayq_web_*``), else the environment (``DELAYQ_WEB_*``)."""
        env = os.environ if environ is None else environ
        conf = app.conf

        def pick(name: str) -> str | None:
            value = raw_setting(conf, f"delayq_web_{name}")  # Django's CELERY_DELAYQ_WEB_* too
            return str(value) if value else (env.get(f"DELAYQ_WEB_{name.upper()}") or None)

        def number(name: str, default: int, *, env_too: bool = True) -> int:
            value = pick(name) if env_too else raw_setting(conf, f"delayq_web_{name}")
            if value is None or value == "":
                return default
            try:
                return int(str(value).strip())
            except ValueError:
                where = f"delayq_web_{name}" + (f" / DELAYQ_WEB_{name.upper()}" if env_too else "")
                raise BadWebSetting(f"{where}: {value!r} is not a whole number (default {default})") from None

        values: dict[str, Any] = dict(token=pick("token"), username=pick("username"), password=pick("password"),
                                      read_only=read_only, body_max=number("body_max", 4096),
                                      page_max=number("page_max", 500, env_too=False),
                                      body_limit=number("body_limit", BODY_LIMIT))
        values.update(overrides)
        return cls(**values)

    def check_binding(self, address: str) -> None:
        """Refuse a non-loopback ``address`` when no authentication is configured."""
        if not is_loopback(address) and not self.auth_required:
            raise UnsafeBinding(
                f"refusing to serve the delayq page on {address} without authentication: anyone who can reach "
                "it could cancel tasks. Set DELAYQ_WEB_TOKEN (or DELAYQ_WEB_USERNAME and DELAYQ_WEB_PASSWORD, "
                "or the delayq_web_* settings), or bind to 127.0.0.1.")
