"""Worker-side request classes: run a due ladder delivery at once, and capture the raw message.

Celery sends every message with an ``eta`` through the worker's timer, even a past one (~7 ms
at p50, ~65 ms at p99 here): :class:`LadderRequest` shows the strategy no eta once it has passed
(the task still sees ``self.request.eta``; a future eta is held as usual).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from celery.worker.request import Request

from .app_ladder import ladder_if_any
from .raw import RAW_KEY, RawMessage, take_raw

__all__ = ["LadderRequest", "CapturingRequest", "RawMessage", "take_raw", "RAW_KEY"]


class LadderRequest(Request):
    """Celery ``Request`` whose ``eta`` is ``None`` once it has passed."""

    @property
    def eta(self) -> datetime | None:
        eta: datetime | None = self._eta
        if eta is not None and eta.timestamp() <= time.time():
            return None
        return eta

    @eta.setter
    def eta(self, value: Any) -> None:  # pragma: no cover - Celery never sets it
        self._eta = value

    def revoked(self) -> bool:
        """Celery's check, after the app's extensions had their say (durable cancels: :mod:`celery_delayq.cancels`)."""
        ladder = ladder_if_any(self.app)
        if ladder is not None and ladder.extensions.request_revoked(ladder, self):
            return True
        return bool(super().revoked())


class CapturingRequest(LadderRequest):
    """A :class:`LadderRequest` that also passes the raw message on to the task (when it may park).

    The raw body rides in a *copy* of ``request.properties``, which reach the task in every pool
    and are never republished (no leak into a retry); :func:`take_raw` takes it out again.
    """

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(message, *args, **kwargs)
        if getattr(self._task, "delayq_captures", True):
            properties = dict(message.properties or {})
            properties.setdefault("application_headers", dict(message.headers or {}))
            body = message.body
            properties[RAW_KEY] = body if isinstance(body, bytes) else str(body).encode("utf-8")
            self._request_dict["properties"] = properties
