"""Old home of the capturing request (before 0.2); it lives in :mod:`celery_delayq.glue.request` now."""

from __future__ import annotations

from ..glue.request import RAW_KEY, CapturingRequest, RawMessage, take_raw

__all__ = ["RawMessage", "CapturingRequest", "take_raw", "RAW_KEY"]
