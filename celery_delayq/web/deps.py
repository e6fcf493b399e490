"""What a route asks for with ``Depends``: the app's :class:`~.service.Service`, who is asking, a page size,
the ids in a path, and the fields of the two list filters (the API's query and the page's form alike).

A test swaps the service for a fake with ``app.dependency_overrides[get_service]``.
No ``from __future__ import annotations`` here: FastAPI reads the filter classes' fields from
their signatures, which must hold real types.
"""

from dataclasses import asdict, dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request

from ..inputs import ID_MAX, BadInput
from ..parking import ParkedFilter
from ..pending.browse import WaitingFilter
from .security import actor
from .service import Service
from .settings import WebSettings

__all__ = ["get_service", "ServiceDep", "SettingsDep", "Who", "Limit", "TaskId", "ParkedId", "WaitingQuery",
           "ParkedQuery"]


def get_service(request: Request) -> Service:
    """The app's :class:`Service` (set by :func:`~celery_delayq.web.create_app`)."""
    found: Service = request.app.state.delayq
    return found


ServiceDep = Annotated[Service, Depends(get_service)]


def get_settings(svc: ServiceDep) -> WebSettings:
    """The page's settings (authentication, limits, read-only)."""
    return svc.settings


SettingsDep = Annotated[WebSettings, Depends(get_settings)]
#: Who sent the request, for the audit line (:func:`~.security.actor`).
Who = Annotated[str, Depends(actor)]


def page_limit(settings: SettingsDep,
               limit: Annotated[int, Query(ge=1, description="At most delayq_web_page_max (500).")] = 50) -> int:
    """The page size asked for, or :class:`BadInput` over ``delayq_web_page_max``."""
    if limit > settings.page_max:
        raise BadInput(f"limit: {limit} is more than {settings.page_max} per page (delayq_web_page_max)")
    return limit


Limit = Annotated[int, Depends(page_limit)]
TaskId = Annotated[str, Path(min_length=1, max_length=ID_MAX, description="A task id (Celery's UUID).")]
ParkedId = Annotated[str, Path(min_length=1, max_length=ID_MAX, description="A parked id, or its start.")]


@dataclass(frozen=True)
class WaitingQuery:
    """The waiting list's filter as typed (blank = not given); :meth:`filter` reads it."""

    task: Annotated[str | None, Query(max_length=500, description="Glob on the task name.")] = None
    queue: Annotated[str | None, Query(max_length=500)] = None
    id: Annotated[str | None, Query(max_length=ID_MAX, description="Task id or its start.")] = None
    args: Annotated[str | None, Query(max_length=500, description="Substring of the arguments.")] = None
    due_after: Annotated[str | None, Query(max_length=100)] = None
    due_before: Annotated[str | None, Query(max_length=100)] = None

    def filter(self, svc: Service, *, retries: bool) -> WaitingFilter:
        """The filter (:meth:`Service.waiting_filter`), or :class:`BadInput` for a time that is not one."""
        return svc.waiting_filter(**asdict(self), retries=retries)

    def given(self) -> dict[str, str]:
        """The fields given (for the page's links to the next and previous page)."""
        return {k: v.strip() for k, v in asdict(self).items() if v and v.strip()}


@dataclass(frozen=True)
class ParkedQuery:
    """The parked list's filter as typed (blank = not given); :meth:`filter` reads it."""

    task: Annotated[str | None, Query(max_length=500, description="Glob on the task name.")] = None
    exception: Annotated[str | None, Query(max_length=500, description="Glob on the exception type.")] = None
    id: Annotated[str | None, Query(max_length=ID_MAX, description="Parked id or its start.")] = None

    def filter(self, svc: Service) -> ParkedFilter:
        """The filter (:meth:`Service.parked_filter`), or :class:`BadInput` for a bad id."""
        parked_id = (self.id or "").strip()
        return svc.parked_filter(task=self.task, exception=self.exception, ids=[parked_id] if parked_id else [])
