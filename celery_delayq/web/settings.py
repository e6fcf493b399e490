"""The web page's settings: from the app's ``delayq_web_*`` settings, then the environment.

Secrets (a token, a basic-auth password) come from settings or the
environment, never from the command line, where ``ps`` would show them.

==============================  ===============================  ===========================================
Setting (``app.conf``)          Environment                      Meaning (default)
==============================  ===============================  ===========================================
``delayq_web_token``            ``DELAYQ_WEB_TOKEN``             ``Authorization: Bearer`` token (none)
``delayq_web_username``         ``DELAYQ_WEB_USERNAME``          HTTP basic user (none)
``delayq_web_password``         ``DELAYQ_WEB_PASSWORD``          HTTP basic password (none)
``delayq_web_body_max``         ``DELAYQ_WEB_BODY_MAX``          Characters of a message body shown (4096)
``delayq_web_page_max``         (none)                           Largest page size the API accepts (500)
==============================  ===============================  ===========================================
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..errors import DelayqError
from ..typing import CeleryApp

__all__ = ["WebSettings", "UnsafeBinding", "is_loopback"]


class UnsafeBinding(DelayqError):
    """Serving beyond loopback without authentication was asked for."""


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
    #: Signs nothing: the CSRF token is a random per-process value compared to the form's copy.
    csrf_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

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
            value = conf.get(f"delayq_web_{name}")
            return str(value) if value else (env.get(f"DELAYQ_WEB_{name.upper()}") or None)

        body_max = pick("body_max")
        page_max = conf.get("delayq_web_page_max")
        values: dict[str, Any] = dict(token=pick("token"), username=pick("username"), password=pick("password"),
                                      read_only=read_only, body_max=int(body_max) if body_max else 4096,
                                      page_max=int(page_max) if page_max else 500)
        values.update(overrides)
        return cls(**values)

    def check_binding(self, address: str) -> None:
        """Refuse a non-loopback ``address`` when no authentication is configured."""
        if not is_loopback(address) and not self.auth_required:
            raise UnsafeBinding(
                f"refusing to serve the delayq page on {address} without authentication: anyone who can reach "
                "it could cancel tasks. Set DELAYQ_WEB_TOKEN (or DELAYQ_WEB_USERNAME and DELAYQ_WEB_PASSWORD, "
                "or the delayq_web_* settings), or bind to 127.0.0.1.")
