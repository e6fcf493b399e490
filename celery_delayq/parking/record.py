"""What a parked message is: its failure metadata headers, and filters over them. Pure.

A parked message is the original message (body, headers and properties as
the worker received them, minus RabbitMQ's ``x-death`` bookkeeping) plus
``x-delayq-parked-*``/``x-delayq-*`` failure headers. Replaying removes the
failure headers again and stamps ``x-delayq-replay`` with the parked id, so
the duplicate guard can tell a replay from the run that failed.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from ..error_groups import message_matches
from ..rabbitmq.client import Message
from ..ladder import headers as H
from ..ladder.formats import PARKED_FORMAT, check_format

__all__ = [
    "PARKED_ID", "PARKED_AT", "REASON", "TASK", "TASK_ID", "ATTEMPTS", "LAST_ATTEMPT",
    "EXC_TYPE", "EXC_MESSAGE", "TRACEBACK", "ORIGIN_EXCHANGE", "ORIGIN_ROUTING_KEY", "REPLAY",
    "FAILURE_HEADERS", "LOOK_HEADERS", "ParkedMessage", "ParkedFilter",
]

#: Unique id of this parking (a replay carries it on as ``x-delayq-replay``).
PARKED_ID = "x-delayq-parked-id"
#: Epoch seconds at which the message was parked.
PARKED_AT = "x-delayq-parked-at"
#: Why: ``exhausted`` (the policy gave up), ``park_on`` (a park-worthy
#: exception) or ``retry-failed`` (the retry could not be published).
REASON = "x-delayq-parked-reason"
TASK = "x-delayq-task"
TASK_ID = "x-delayq-task-id"
#: Attempts made, the failed one included.
ATTEMPTS = "x-delayq-attempts"
#: Epoch seconds at which the last (failed) attempt started.
LAST_ATTEMPT = "x-delayq-last-attempt"
#: ``module.QualifiedName`` of the exception, its ``str()`` and formatted traceback.
EXC_TYPE = "x-delayq-exc-type"
EXC_MESSAGE = "x-delayq-exc-message"
TRACEBACK = "x-delayq-traceback"
#: Where the message was delivered from: a replay publishes it there again.
ORIGIN_EXCHANGE = "x-delayq-origin-exchange"
ORIGIN_ROUTING_KEY = "x-delayq-origin-routing-key"
#: On a replayed message: the parked id it was replayed from (the ladder's header table names it).
REPLAY = H.REPLAY

#: Headers added by parking, removed again by a replay.
FAILURE_HEADERS = (PARKED_ID, PARKED_AT, REASON, TASK, TASK_ID, ATTEMPTS, LAST_ATTEMPT,
                   EXC_TYPE, EXC_MESSAGE, TRACEBACK, ORIGIN_EXCHANGE, ORIGIN_ROUTING_KEY, PARKED_FORMAT)
#: Headers of a previous pass through the ladder; a replay starts a new one.
_PASS_HEADERS = (H.DUE, H.DELAY, H.ENTRY, H.HOPS)
#: What a quorum queue adds to a message it hands out again: counts of looks, not of the
#: task's attempts. Dropped when read, so a replayed copy never carries them on.
LOOK_HEADERS = ("x-delivery-count", "x-acquired-count")


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


@dataclass(frozen=True)
class ParkedMessage:
    """One message in a parking queue, with its failure metadata decoded."""

    parked_id: str
    parked_at: float | None
    reason: str
    task: str
    task_id: str
    attempts: int
    first_attempt: float | None
    last_attempt: float | None
    exc_type: str
    exc_message: str
    traceback: str
    exchange: str
    routing_key: str
    headers: Mapping[str, Any] = field(repr=False)
    properties: Mapping[str, Any] = field(repr=False)
    body: bytes = field(repr=False)

    @classmethod
    def from_amqp(cls, message: Message) -> "ParkedMessage":
        """Decode a message read from a parking queue.

        Raises:
            FormatTooNew: its failure headers are in a newer format than this release reads.
        """
        hdrs = {k: v for k, v in (message.headers or {}).items() if k not in LOOK_HEADERS}
        check_format(hdrs, "parked")
        props = {k: v for k, v in message.properties.items() if k != "application_headers"}
        body = message.body if isinstance(message.body, bytes) else _text(message.body).encode("utf-8")
        return cls(
            parked_id=_text(hdrs.get(PARKED_ID)), parked_at=_float(hdrs.get(PARKED_AT)),
            reason=_text(hdrs.get(REASON)), task=_text(hdrs.get(TASK) or hdrs.get("task")),
            task_id=_text(hdrs.get(TASK_ID) or hdrs.get("id")), attempts=int(hdrs.get(ATTEMPTS) or 0),
            first_attempt=_float(hdrs.get(H.FIRST_ATTEMPT)), last_attempt=_float(hdrs.get(LAST_ATTEMPT)),
            exc_type=_text(hdrs.get(EXC_TYPE)), exc_message=_text(hdrs.get(EXC_MESSAGE)),
            traceback=_text(hdrs.get(TRACEBACK)),
            exchange=_text(hdrs.get(ORIGIN_EXCHANGE)), routing_key=_text(hdrs.get(ORIGIN_ROUTING_KEY)),
            headers=hdrs, properties=props, body=body,
        )

    def replay_headers(self, *, reset_attempts: bool = False) -> dict[str, Any]:
        """The original headers for a replay: failure and ladder-pass headers removed, replay id stamped.

        With ``reset_attempts`` the task starts over (``retries`` 0, a new first
        attempt); otherwise a replay is one more attempt after the failed one,
        so a policy that had given up gives up again if it fails.
        """
        hdrs = {k: v for k, v in self.headers.items() if k not in FAILURE_HEADERS and k not in _PASS_HEADERS}
        if "eta" in hdrs:
            hdrs["eta"] = None  # the old eta is long past; a delayed replay sets a new one
        if reset_attempts:
            if "retries" in hdrs:
                hdrs["retries"] = 0
            hdrs.pop(H.ATTEMPT, None)
            hdrs.pop(H.FIRST_ATTEMPT, None)
        hdrs[REPLAY] = self.parked_id
        return hdrs

    def to_dict(self, *, with_body: bool = False) -> dict[str, Any]:
        """JSON-friendly form (the CLI's ``--json`` output): the metadata fields; ``with_body`` adds the message."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        if with_body:
            out["headers"] = {k: _text(v) if isinstance(v, bytes) else v for k, v in self.headers.items()}
            out["properties"] = dict(self.properties)
            out["body"] = self.body.decode("utf-8", "replace")
        return out


@dataclass(frozen=True)
class ParkedFilter:
    """Which parked messages an operation applies to; every given criterion must match.

    Attributes:
        task: Glob on the task name (``proj.tasks.*``).
        exception: Glob on the exception type, qualified (``requests.*``) or bare (``*Timeout``).
        message: The exception's message: its pattern as grouped
            (:func:`~celery_delayq.error_groups.message_pattern`), or text in it.
        since: Parked at or after this epoch time.
        until: Parked before this epoch time.
        ids: Parked-id prefixes (as the list shows them).
        task_ids: Task-id prefixes (a full task id is its own prefix). With ``ids``
            too, a message matches when either fits.
        exactly: Whole parked ids: only these messages. An action confirmed on
            a count acts on exactly the messages counted (the CLI's ``--expect``,
            the page's prompt); a message parked since then is left alone.
    """

    task: str | None = None
    exception: str | None = None
    message: str | None = None
    since: float | None = None
    until: float | None = None
    ids: tuple[str, ...] = ()
    task_ids: tuple[str, ...] = ()
    exactly: frozenset[str] | None = None

    def __call__(self, message: ParkedMessage) -> bool:
        if self.exactly is not None and message.parked_id not in self.exactly:
            return False
        if self.task and not fnmatch.fnmatchcase(message.task, self.task):
            return False
        if self.exception and not any(fnmatch.fnmatchcase(name, self.exception)  # qualified, or bare
                                      for name in (message.exc_type, message.exc_type.rsplit(".", 1)[-1])):
            return False
        if self.message and not message_matches(message.exc_message, self.message):
            return False
        at = message.parked_at
        if self.since is not None and (at is None or at < self.since):
            return False
        if self.until is not None and (at is None or at >= self.until):
            return False
        if (self.ids or self.task_ids) and not (any(message.parked_id.startswith(p) for p in self.ids)
                                                or any(message.task_id.startswith(p) for p in self.task_ids)):
            return False
        return True

    @property
    def everything(self) -> bool:
        """True when the filter matches every message."""
        return self == ParkedFilter()
