"""What a route asks for with ``Depends`` besides the service (:func:`.service.get_service`): the settings, who
is asking, a page size, the ids in a path, and the fields of the two list filters (the API's query and the page's
form alike). The filters hand their fields to the service they are given; this module needs its type only.

No ``from __future__ import annotations`` here: FastAPI reads the filter classes' fields from
their signatures, which must hold real types.
"""

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Form, Path, Query, Request

from ..inputs import ID_MAX, MESSAGE, BadInput
from ..parking.record import ParkedFilter
from ..pending.browse import WaitingFilter
from .security import actor
from .settings import WebSettings

if TYPE_CHECKING:
    from .service import Service

__all__ = ["SettingsDep", "Who", "Limit", "Offset", "TaskId", "ParkedId", "WaitingQuery",
           "ParkedQuery", "WaitingForm", "ParkedForm", "flag", "count"]


def get_settings(request: Request) -> WebSettings:
    """The page's settings (authentication, limits, read-only), as :func:`~celery_delayq.web.create_app` got them."""
    found: WebSettings = request.app.state.delayq_settings
    return found


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
#: Where a page starts (the API's lists and the pages' links alike).
Offset = Annotated[int, Query(ge=0, le=10_000_000, description="Items to skip: the page starts after them.")]
TaskId = Annotated[str, Path(min_length=1, max_length=ID_MAX, description="A task id (Celery's UUID).")]
ParkedId = Annotated[str, Path(min_length=1, max_length=ID_MAX, description="A parked id, or its start.")]


class _Given:
    def given(self) -> dict[str, str]:
        """The fields given (for the page's links and its bulk forms)."""
        return {k: v.strip() for k, v in vars(self).items() if v and v.strip()}


@dataclass(frozen=True)
class WaitingQuery(_Given):
    """The waiting list's filter as typed (blank = not given); :meth:`filter` reads it."""

    task: Annotated[str | None, Query(max_length=500, description="Glob on the task name.")] = None
    queue: Annotated[str | None, Query(max_length=500)] = None
    id: Annotated[str | None, Query(max_length=ID_MAX, description="Task id or its start.")] = None
    args: Annotated[str | None, Query(max_length=500, description="Substring of the arguments.")] = None
    due_after: Annotated[str | None, Query(max_length=100)] = None
    due_before: Annotated[str | None, Query(max_length=100)] = None
    error: Annotated[str | None, Query(max_length=500, description="Glob on a retry's last exception type.")] = None
    message: Annotated[str | None, Query(max_length=500, description=MESSAGE)] = None

    def filter(self, svc: "Service", *, retries: bool) -> WaitingFilter:
        """The filter (:meth:`Service.waiting_filter`), or :class:`BadInput` for a time that is not one."""
        return svc.waiting_filter(**asdict(self), retries=retries)


@dataclass(frozen=True)
class ParkedQuery(_Given):
    """The parked list's filter as typed (blank = not given); :meth:`filter` reads it."""

    task: Annotated[str | None, Query(max_length=500, description="Glob on the task name.")] = None
    exception: Annotated[str | None, Query(max_length=500, description="Glob on the exception type.")] = None
    id: Annotated[str | None, Query(max_length=ID_MAX, description="Parked id or its start.")] = None
    message: Annotated[str | None, Query(max_length=500, description=MESSAGE)] = None

    def filter(self, svc: "Service") -> ParkedFilter:
        """The filter (:meth:`Service.parked_filter`), or :class:`BadInput` for a bad id."""
        parked_id = (self.id or "").strip()
        return svc.parked_filter(task=self.task, exception=self.exception, message=self.message,
                                 ids=[parked_id] if parked_id else [])


# -- the page's forms (a bulk form sends the filter it was shown with, as the page's own text) ----------
def flag(value: str, name: str) -> bool:
    """A form's checkbox or hidden flag: ``1`` (or ``on``, a checkbox's) is set, blank is not, nothing else."""
    if value in ("", "0"):
        return False
    if value in ("1", "on", "true"):
        return True
    raise BadInput(f"{name}: {value[:40]!r} is not a flag; send 1 or leave it out")


def count(value: str) -> int:
    """The ``expect`` count a bulk button sends (the number it showed)."""
    text = value.strip()
    if not text.isdigit() or len(text) > 12:
        raise BadInput(f"expect: {value[:40]!r} is not a count; reload the page and use its button")
    return int(text)


@dataclass
class _BulkForm:
    """What every bulk form sends: the count it showed, ``all`` when no filter is set, and the filter."""

    expect: str = Form("")
    all: str = Form("")
    task: str = Form("")
    message: str = Form("")


@dataclass
class WaitingForm(_BulkForm):
    """A waiting-list bulk form: the filter it was shown with, ``all`` when none, the count it showed."""

    queue: str = Form("")
    id: str = Form("")
    args: str = Form("")
    due_after: str = Form("")
    due_before: str = Form("")
    error: str = Form("")
    retries: str = Form("")

    def fields(self) -> dict[str, Any]:
        """The filter's fields, as :meth:`Service.waiting_filter` takes them."""
        return {k: getattr(self, k) for k in ("task", "queue", "id", "args", "due_after", "due_before", "error",
                                              "message")} | {"retries": flag(self.retries, "retries")}


@dataclass
class ParkedForm(_BulkForm):
    """A parked-list form: the filter it was shown with (or the selected ids), ``all``, the count it showed."""

    exception: str = Form("")
    parked_id: list[str] = Form([])

    def selection(self) -> dict[str, Any]:
        """``everything``, ``expect`` (the ids sent, for selected rows) and the filter, as the service takes them."""
        expect = count(self.expect) if self.expect.strip() or not self.parked_id else len(set(self.parked_id))
        return {"everything": flag(self.all, "all"), "expect": expect, "dry_run": False}

    def fields(self) -> dict[str, Any]:
        """The filter (or the selected ids), as :meth:`Service.parked_filter` takes it."""
        return {"task": self.task, "exception": self.exception, "message": self.message, "ids": self.parked_id}


