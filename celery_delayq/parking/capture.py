"""Hand the message a worker received to the task, so a parked copy is the exact original.

Celery gives a task its arguments, its headers and the message properties
(``request.properties``, which on RabbitMQ include ``application_headers``),
but not the body as it was sent. The worker-side request of a
DelayedRetryTask adds the raw body to a *copy* of those properties: they
travel to the task with the request in every pool (prefork pickles them to
the child), and Celery never republishes ``request.properties``, so the body
cannot leak into a retry the way an extra header would. The task takes the
body out again at the start of the attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..request import LadderRequest

__all__ = ["RawMessage", "CapturingRequest", "take_raw", "RAW_KEY"]

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
    """Worker request that passes the raw body on to the task (when the task may park)."""

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
