"""The raw message a task may park: what :class:`~celery_delayq.glue.request.CapturingRequest` captures.

Kept apart from the request classes (which ask the app's ladder about revokes), so that what reads a captured
message (the attempt counter, the parking of a failed task) needs nothing of the ladder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["RAW_KEY", "RawMessage", "take_raw"]

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
