"""``/api/overview`` and ``/api/doctor``: what the ladder holds and what the doctor says."""

from __future__ import annotations

from fastapi import APIRouter

from ..service import ServiceDep
from ..errors import READ
from ..schemas import Finding, Overview

__all__ = ["router"]

router = APIRouter(prefix="/api", tags=["overview"])


@router.get("/overview", response_model_by_alias=True, responses=READ,
            summary="The ladder: counts, levels, leaders, due soon")
def overview(svc: ServiceDep) -> Overview:
    """``delayq status --json`` plus the tasks due in the next minute and hour (and retries waiting)."""
    return svc.overview()


@router.get("/doctor", responses=READ, summary="The doctor's findings")
def doctor(svc: ServiceDep) -> list[Finding]:
    """What ``delayq doctor --json`` says."""
    return [Finding.model_validate(f.as_dict()) for f in svc.findings()]
