"""``/api/parked``: the messages in the parking queue; replay or delete the matching ones, or one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from ..deps import Limit, Offset, ParkedId, ParkedQuery, Who
from ..service import ServiceDep
from ..errors import PARKED_READ, PARKED_READ_ONE, WRITE
from ..schemas import Bulk, ErrorGroupOut, Parked, ParkedDetail, ParkedList, ParkedReplay, ParkedSelect

__all__ = ["router"]

router = APIRouter(prefix="/api/parked", tags=["parked"])


# Fixed paths (/replay, /delete) are declared before the id path they also fit (/{parked_id}).
@router.get("", responses=PARKED_READ, summary="Parked messages, oldest first")
def parked(svc: ServiceDep, q: Annotated[ParkedQuery, Depends()], limit: Limit, offset: Offset = 0) -> ParkedList:
    """One page of the parked messages matching every filter given, and every match grouped by exception
    class and message pattern (the queue is left as it was)."""
    page = svc.parked(q.filter(svc), offset=offset, limit=limit)
    return ParkedList(total=page.total, matched=page.matched, offset=page.offset, limit=page.limit,
                      items=[Parked.of(p, body_max=svc.settings.body_max) for p in page.items],
                      groups=[ErrorGroupOut.model_validate(g, from_attributes=True) for g in page.groups])


@router.post("/replay", responses=WRITE, summary="Replay matching parked messages")
def parked_replay(svc: ServiceDep, who: Who, body: ParkedReplay) -> Bulk:
    """Count (``dry_run``, the default) or replay the matching parked messages, after ``delay``
    (``reset_attempts``: their retries start over)."""
    return svc.replay(body.fields(), **body.how(), delay=body.delay, reset_attempts=body.reset_attempts, who=who,
                      via="api")


@router.post("/delete", responses=WRITE, summary="Delete matching parked messages")
def parked_delete(svc: ServiceDep, who: Who, body: ParkedSelect) -> Bulk:
    """Count (``dry_run``, the default) or delete the matching parked messages (no undo)."""
    return svc.delete_parked(body.fields(), **body.how(), who=who, via="api")


@router.get("/{parked_id}", responses=PARKED_READ_ONE, summary="One parked message, with body and headers")
def parked_one(svc: ServiceDep, parked_id: ParkedId) -> ParkedDetail:
    """The parked message whose id starts with ``parked_id`` (body cut at ``delayq_web_body_max``)."""
    return ParkedDetail.of(svc.parked_one(parked_id), body_max=svc.settings.body_max)


@router.delete("/{parked_id}", responses=WRITE, summary="Delete one parked message")
def parked_delete_one(svc: ServiceDep, who: Who, parked_id: ParkedId) -> Bulk:
    """Delete this parked message (no undo)."""
    found = svc.parked_one(parked_id)
    return svc.delete_parked({"ids": [found.parked_id]}, everything=False, dry_run=False, expect=1, who=who,
                             via="api")
