"""The API's request and answer models (pydantic): the OpenAPI document's schemas, and what every route returns.

Each answer model is built from the package's own JSON form of the thing it shows
(``PendingTask.as_dict``, ``ParkedMessage.to_dict``, ``CancelResult.as_dict``, ...), so the
API and the CLI's ``--json`` say the same; the ``of`` constructors add only what the web
cuts or adds (text cut at ``delayq_web_body_max``, seconds until due).
"""

from __future__ import annotations

import dataclasses
import time
import typing
from typing import TYPE_CHECKING, Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, create_model, StrictBool, StrictFloat, StrictInt, StrictStr

from ..inputs import DELAY_FORMS, DUE_FORMS, ID_MAX, MESSAGE
from ..parking.record import ParkedMessage
from ..index.query import PendingTask

if TYPE_CHECKING:
    from ..pending.browse import Page

__all__ = ["Error", "Waiting", "WaitingPage", "DueSoon", "Totals", "Overview", "Finding", "Cancelled", "Moved",
           "Parked", "ParkedDetail", "ParkedList", "Bulk", "CancelFilter", "NewDue", "ParkedSelect", "ParkedReplay",
           "Pass", "WaitingDetail", "ErrorGroupOut", "MoveFilter", "MoveSelected"]


class Error(BaseModel):
    """Every 4xx/5xx answer: what was wrong (naming the field) and the status; nothing was changed."""

    error: str
    status: int


# -- answers ---------------------------------------------------------------------------------------
class Waiting(BaseModel):
    """A waiting task."""

    task_id: str
    task: str | None
    exchange: str
    routing_key: str
    queue: str | None
    due: str
    attempt: int
    args: str | None
    kwargs: str | None
    last_error: str | None
    in_s: float
    retry: bool

    @classmethod
    def of(cls, t: PendingTask, *, body_max: int, now: float | None = None) -> Waiting:
        """``t`` as the API shows it at ``now`` (argument text cut at ``body_max``)."""
        now = time.time() if now is None else now
        doc = t.as_dict()
        for key in ("args", "kwargs"):
            if isinstance(doc.get(key), str) and len(doc[key]) > body_max:
                doc[key] = doc[key][:body_max] + "…"
        return cls(**doc, in_s=round(t.due - now, 3), retry=t.attempt > 0)


class Pass(BaseModel):
    """One pass of a task through the ladder, as the index recorded it (its first delay, a retry, a move)."""

    entry: str | None
    due: str
    attempt: int
    last_error: str | None

    @classmethod
    def of(cls, t: PendingTask) -> Pass:
        """The pass ``t`` (one entry of the index)."""
        return cls(entry=t.entry, due=t.due_iso, attempt=t.attempt, last_error=t.last_error)


class WaitingDetail(Waiting):
    """A waiting task with every pass of it the index still holds, oldest first, and a retry's last traceback."""

    last_traceback: str | None = None
    passes: list[Pass]


class WaitingPage(BaseModel):
    """One page of waiting tasks, soonest due first."""

    total: int
    offset: int
    limit: int
    read_s: float
    items: list[Waiting]

    @classmethod
    def of(cls, page: Page, *, body_max: int) -> WaitingPage:
        """The API's form of ``page``."""
        now = time.time()
        return cls(total=page.total, offset=page.offset, limit=page.limit, read_s=round(page.read_s, 3),
                   items=[Waiting.of(t, body_max=body_max, now=now) for t in page.items])


class DueSoon(BaseModel):
    """Waiting tasks due within the next minute and hour, and retries waiting."""

    next_minute: int
    next_hour: int
    retries: int


class Totals(BaseModel):
    """Messages in the ladder, parked, unroutable, held (None: the management API was not reachable)."""

    model_config = ConfigDict(extra="allow")
    waiting: int
    parked: int
    unroutable: int
    held: int | None


class Overview(BaseModel):
    """``delayq status --json``'s document, plus what is due soon and the last hour of telemetry."""

    model_config = ConfigDict(extra="allow")
    schema_: int = Field(alias="schema", description="The document's version.")
    observed_at: str
    broker: str
    ladder: dict[str, Any]
    exists: bool
    complete: bool
    missing: list[str]
    totals: Totals
    levels: list[dict[str, Any]]
    parking: dict[str, Any]
    unroutable: dict[str, Any]
    next_due_by: str | None
    all_due_by: str | None
    due_soon: DueSoon | None
    index_error: str | None = None
    last_hour: dict[str, Any] | None


class Finding(BaseModel):
    """One of the doctor's findings."""

    check: str
    status: str = Field(description="ok, warn or error")
    summary: str
    next_step: str
    details: dict[str, Any]


class Cancelled(BaseModel):
    """A cancel recorded (``delayq cancel --json``'s object)."""

    task_id: str
    given: str
    until: str | None
    waiting: bool
    task: str | None
    due: str | None


class Moved(BaseModel):
    """A task run now or moved to a new due time (it runs once, with the same id)."""

    task_id: str
    task: str | None
    was_due: str
    due: str | None
    run_now: bool


#: ``ParkedMessage``'s fields as its ``to_dict()`` gives them (the CLI's ``--json``): the one list of them.
_PARKED_HINTS = typing.get_type_hints(ParkedMessage)
_PARKED_FIELDS: dict[str, Any] = {f.name: (_PARKED_HINTS[f.name], ...) for f in dataclasses.fields(ParkedMessage)
                                  if f.name not in ("headers", "properties", "body")}


class Parked(create_model("_ParkedFields", **_PARKED_FIELDS)):  # type: ignore[misc]
    """A parked message (without its body)."""

    @classmethod
    def of(cls, p: ParkedMessage, *, body_max: int) -> Parked:
        """``p`` without its body (traceback cut at ``body_max``, 4096 at least)."""
        parked: Parked = cls.model_validate(_cut_traceback(p.to_dict(), body_max))
        return parked


class ParkedDetail(Parked):
    """A parked message with its headers, properties and body (cut at ``delayq_web_body_max``)."""

    headers: dict[str, Any]
    properties: dict[str, Any]
    body: str
    body_truncated: bool

    @classmethod
    def of(cls, p: ParkedMessage, *, body_max: int) -> ParkedDetail:
        """``p`` with its body cut at ``body_max``."""
        doc = _cut_traceback(p.to_dict(with_body=True), body_max)
        return cls(**{**doc, "body": doc["body"][:body_max]}, body_truncated=len(doc["body"]) > body_max)


def _cut_traceback(doc: dict[str, Any], body_max: int) -> dict[str, Any]:
    doc["traceback"] = (doc.get("traceback") or "")[: max(body_max, 4096)]
    return doc


class ErrorGroupOut(BaseModel):
    """Failures of one exception class (``pattern`` null: the class as a whole) and message pattern.

    To act on a group, send ``exception`` (and ``message``: the pattern) as the filter.
    """

    exception: str
    pattern: str | None
    count: int


class ParkedList(BaseModel):
    """Parked messages matching the filter (oldest first, from ``offset``, at most ``limit``), and every match
    grouped by exception class and message pattern."""

    total: int = Field(description="Messages parked in all.")
    matched: int = Field(description="Messages matching the filter.")
    offset: int
    limit: int
    items: list[Parked]
    groups: list[ErrorGroupOut]


class Bulk(BaseModel):
    """What a bulk action matched and did (nothing on a dry run)."""

    matched: int
    done: int
    dry_run: bool
    ids: list[str] = Field(description="The first 100 ids matched.")

    @classmethod
    def of(cls, found: Sequence[str], done: int, *, dry_run: bool) -> Bulk:
        """``found`` matched (the first 100 ids are named), ``done`` acted on."""
        return cls(matched=len(found), done=done, dry_run=dry_run, ids=list(found[:100]))


# -- requests --------------------------------------------------------------------------------------
_Text = Field(None, max_length=500)
_EXPECT = Field(None, ge=0, description="To act (dry_run false): the count a dry run returned. When the "
                                        "selection now matches another count, nothing is done (409).")
_ALL = Field(False, description="Select every one, explicitly; an empty filter never means everything. "
                                "Not with a filter.")


class _Bulk(BaseModel):
    """How a bulk action selects and confirms: ``all`` (not with a filter), a dry run, the count confirmed."""

    all: StrictBool = _ALL
    dry_run: StrictBool = True
    expect: StrictInt | None = _EXPECT

    def how(self) -> dict[str, Any]:
        """``everything``, ``dry_run`` and ``expect``, as the service's bulk actions take them."""
        return {"everything": self.all, "dry_run": self.dry_run, "expect": self.expect}


class CancelFilter(_Bulk):
    """Cancel every waiting task that matches (``dry_run``, the default: count only).

    A filter (at least one field) or ``all: true`` is required; acting needs ``expect``.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"task": "proj.tasks.*", "args": "customer-42"}, {"task": "proj.tasks.report", "dry_run": False, "expect": 3}]})
    task: StrictStr | None = Field(None, max_length=500, description="Glob on the task name.")
    queue: StrictStr | None = _Text
    id: StrictStr | None = Field(None, max_length=ID_MAX, description="Task id or its start.")
    args: StrictStr | None = Field(None, max_length=500, description="Substring of the arguments.")
    due_after: StrictStr | None = Field(None, max_length=100)
    due_before: StrictStr | None = Field(None, max_length=100)
    retries: StrictBool = Field(False, description="Only retries (a filter by itself).")
    error: StrictStr | None = Field(None, max_length=500, description="Glob on a retry's last exception type.")
    message: StrictStr | None = Field(None, max_length=500, description=MESSAGE)

    def fields(self) -> dict[str, Any]:
        """The filter's fields, for :meth:`Service.cancel_matching`."""
        return self.model_dump(include={"task", "queue", "id", "args", "due_after", "due_before", "retries", "error",
                                        "message"})


class MoveFilter(CancelFilter):
    """Run now or move every waiting task that matches (``dry_run``, the default: count only)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"task": "proj.tasks.*", "due": "10m"}, {"error": "TimeoutError", "dry_run": False, "expect": 3}]})
    due: StrictStr | None = Field(None, max_length=100, description=f"{DUE_FORMS}; none: run now.")


class MoveSelected(BaseModel):
    """Run now or move these waiting tasks (each must be waiting, or none is moved)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"ids": ["4f1c..."], "due": "2h"}]})
    ids: list[StrictStr] = Field(..., min_length=1, max_length=1000, description="Whole task ids.")
    due: StrictStr | None = Field(None, max_length=100, description=f"{DUE_FORMS}; none: run now.")


class NewDue(BaseModel):
    """When the task should now run: strictly in the future (to run it now, use run-now)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"due": "10m"},
                                                                          {"due": "2030-01-01T09:00:00"}]})
    due: StrictStr = Field(..., max_length=100, description=DUE_FORMS)


class ParkedSelect(_Bulk):
    """Which parked messages (``dry_run``, the default: count only).

    A filter (task, exception or ids) or ``all: true`` is required; acting needs ``expect``.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"exception": "*Timeout"}, {"all": True, "dry_run": False, "expect": 2}]})
    task: StrictStr | None = Field(None, max_length=500, description="Glob on the task name.")
    exception: StrictStr | None = Field(None, max_length=500, description="Glob on the exception type.")
    message: StrictStr | None = Field(None, max_length=500, description=MESSAGE)
    ids: list[StrictStr] = Field(default_factory=list, max_length=1000, description="Parked ids (or their start).")

    def fields(self) -> dict[str, Any]:
        """The filter's fields, for the service."""
        return self.model_dump(include={"task", "exception", "message", "ids"})


class ParkedReplay(ParkedSelect):
    """Which parked messages to replay, and after how long."""

    delay: StrictFloat | StrictInt | StrictStr | None = Field(
        None, description=f"{DELAY_FORMS}; none: now.")
    reset_attempts: StrictBool = Field(False, description="Start the tasks' retries over instead of one more "
                                                          "attempt after the one that failed.")
