"""Worker-side request classes: run a due ladder delivery at once, and capture the raw message.

Celery sends every message with an ``eta`` through the worker's timer, even a past one (~7 ms
at p50, ~65 ms at p99 here): :class:`LadderRequest` shows the strategy no eta once it has passed
(the task still sees ``self.request.eta``; a future eta is held as usual).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from celery.worker.request import Request

from .app_ladder import ladder_if_any

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


#: Key of the raw body in the request's copy of the message properties.
RAW_KEY = "x-delayq-raw-body"


@dataclass(frozen=True)
class RawMessage:
    """A delivered message as the broker gave it."""

    body: bytes
    headers: Mapping[str, Any] = field(repr=False)
    properties: Mapping[str, Any] = field(repr=False)
    exchange: str
    routing_key: str


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


def take_raw(request: Any) -> RawMessage | None:
    """Take the raw message off a task request (``None`` when it was not captured)."""
    properties = getattr(request, "properties", None)
    if not isinstance(properties, dict) or RAW_KEY not in properties:
        return None
    properties = dict(properties)
    body = properties.pop(RAW_KEY)
    request.properties = properties  # the task sees the message properties as Celery gives them
    headers = properties.pop("application_headers", None) or {}
    info = getattr(request, "delivery_info", None) or {}
    return RawMessage(body=body, headers=dict(headers), properties=properties,
                      exchange=info.get("exchange") or "", routing_key=info.get("routing_key") or "")
