"""``/api/changes`` and ``/api/series``: what keeps an open page current, and the overview's charts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from ..service import ServiceDep
from ..errors import READ
from ..live import SERIES, Changes, ChartSeries, Live, SeriesCache, WindowName, live_of

__all__ = ["router", "get_live", "get_series"]

router = APIRouter(prefix="/api", tags=["live"])


def get_live(svc: ServiceDep) -> Live:
    """The process's change signal for the app's service (a test overrides it)."""
    return live_of(svc)


def get_series() -> SeriesCache:
    """The process's kept chart series."""
    return SERIES


@router.get("/changes", responses=READ, summary="The change signal an open page polls")
def changes(live: Annotated[Live, Depends(get_live)], response: Response) -> Changes:
    """A version of what the pages show (the waiting list and the parked count), computed at most once a
    second per process whoever asks: a page compares its ``changed_at`` with when it was rendered."""
    found = live.changes()
    response.headers["ETag"] = f'"{found.version}"'
    response.headers["Cache-Control"] = "no-store"
    return found


@router.get("/series", responses=READ, summary="Telemetry per time bucket, for the charts")
def chart_series(svc: ServiceDep, kept: Annotated[SeriesCache, Depends(get_series)],
                 window: Annotated[WindowName, Query(description="1h (1-minute buckets), 24h (15 minutes), "
                                                                 "7d (1 hour).")] = "1h") -> ChartSeries:
    """Scheduled, delivered, retried and parked per bucket, and the deliveries' lateness p50 and p99, from the
    events the recorder writes under ``delayq_telemetry_dir`` (``available: false`` when it is off)."""
    return kept.get(svc.context.config.telemetry_dir, window)
