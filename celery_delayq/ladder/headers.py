"""Names of the message headers celery_delayq reads and writes, and header hygiene.

The ladder's own bookkeeping travels in ``x-delayq-*`` headers so that any consumer, the parking queue and the
telemetry can tell where a message has been without asking the broker.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = [
    "FORMAT", "FORMAT_VERSION", "DUE", "DELAY", "ENTRY", "ATTEMPT", "FIRST_ATTEMPT", "EXCHANGE", "ROUTING_KEY", "HOPS", "LAPS", "PASS",
    "REPLAY", "LAST_ERROR", "LAST_ERROR_MAX", "last_error", "LAST_TRACEBACK", "LAST_TRACEBACK_MAX", "last_traceback", "strip_broker_headers", "stamp_pass", "forget_pass", "attempt_of",
]

#: Version of these headers' format (:mod:`.formats`; 0.1.0 wrote none, which reads as 1), on every pass.
FORMAT = "x-delayq-format"
#: The version this release writes (:data:`.formats.VERSIONS` ``["ladder"]``).
FORMAT_VERSION = 1
#: Epoch seconds at which the message is due at its destination.
DUE = "x-delayq-due"
#: The delay that was requested, in seconds (before rounding up to units).
DELAY = "x-delayq-delay"
#: Unique id of this pass through the ladder; a redelivery of the same pass repeats it.
ENTRY = "x-delayq-entry"
#: Attempt number, our own counter: RabbitMQ 4.x ignores client x-death. Written only where
#: nothing else says it (read it with :func:`attempt_of`): a Celery task's ``retries`` header is
#: the count, and absent means 0. Messages of 0.x carry it on every pass; they read the same.
ATTEMPT = "x-delayq-attempt"
#: Wall-clock epoch seconds of the first attempt, so time-based stop rules survive restarts.
#: A retry stamps it (:mod:`celery_delayq.task`); a first pass goes without.
FIRST_ATTEMPT = "x-delayq-first-attempt"
#: Where an undelayed publish would have gone.
EXCHANGE = "x-delayq-exchange"
ROUTING_KEY = "x-delayq-routing-key"
#: Queues the message waits in, for telemetry and the broker-cost benchmark.
HOPS = "x-delayq-hops"
#: Laps a delay longer than the ladder has made so far (absent: none).
LAPS = "x-delayq-laps"
#: The destination queue, when the publish named one (Celery's ``declare``); for ``delayq pending``.
QUEUE = "x-delayq-queue"
#: On a replayed parked message: the parked id it was replayed from (so the duplicate
#: guard sees a replay as a new delivery; written by :mod:`celery_delayq.parking`).
REPLAY = "x-delayq-replay"

#: A retry's last exception, ``Type: message`` truncated to :data:`LAST_ERROR_MAX` characters
#: (``delayq pending`` and the web page show it; the traceback stays in the worker's log).
LAST_ERROR = "x-delayq-last-error"
LAST_ERROR_MAX = 200
#: A retry's last traceback, its last :data:`LAST_TRACEBACK_MAX` characters. It goes into the index
#: entry of the retry's pass (for the page's detail of a retry), never into the message: the
#: scheduler takes it out before the message is placed, so no hop carries it.
LAST_TRACEBACK = "x-delayq-last-traceback"
LAST_TRACEBACK_MAX = 4000

#: The headers that describe one pass through the ladder (a retry copies its
#: request's headers, so they must be forgotten before the next pass).
PASS = (DUE, DELAY, ENTRY, HOPS)

_BROKER_PREFIXES = ("x-first-death-", "x-last-death-")


def stamp_pass(headers: dict[str, Any], *, due: float, delay: float, entry: str, hops: int,
               exchange: str, routing_key: str) -> dict[str, Any]:
    """Record one ladder pass in ``headers`` (in place; returned for convenience).

    It also states the version of these headers' format (:mod:`.formats`). Every header is encoded by the client
    and copied by the broker at every hop, so a pass writes only what nothing else carries: no :data:`ATTEMPT`
    on a Celery task (its ``retries`` header is the count; a stale one copied from an earlier pass goes) nor at
    attempt 0, and no :data:`FIRST_ATTEMPT` (a retry stamps it; one from an earlier pass stays, so time-based
    stop rules measure from the very first run).
    """
    headers.update({DUE: due, DELAY: delay, ENTRY: entry, HOPS: hops,
                    EXCHANGE: exchange, ROUTING_KEY: routing_key, FORMAT: FORMAT_VERSION})
    if "retries" in headers or not headers.get(ATTEMPT):  # Celery's own counter is the truth; 0 goes without
        headers.pop(ATTEMPT, None)
    return headers


def attempt_of(headers: Mapping[str, Any]) -> int:
    """The attempt number a message's headers say: :data:`ATTEMPT`, else Celery's ``retries``, else 0.

    :data:`ATTEMPT` wins where present: a message of 0.x carries it on every
    pass, equal to ``retries`` on a Celery task.
    """
    value = headers.get(ATTEMPT)
    if value is None:
        value = headers.get("retries")
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def forget_pass(headers: dict[str, Any]) -> None:
    """Drop the headers of a previous ladder pass (in place)."""
    for name in PASS:
        headers.pop(name, None)


def strip_broker_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``headers`` without ``x-death`` and ``x-{first,last}-death-*``.

    RabbitMQ before 4.0.1 honours a client-sent ``x-death``; its cycle detection then silently drops a retried
    message that passes the same ladder queue again. The ladder re-enters the same queues on every retry, so
    these headers must never be republished.
    """
    return {k: v for k, v in headers.items() if k != "x-death" and not k.startswith(_BROKER_PREFIXES)}


def last_traceback(exc: object) -> str | None:
    """The :data:`LAST_TRACEBACK` text of ``exc`` (its end, where the failing line is); ``None`` without one."""
    if not isinstance(exc, BaseException) or exc.__traceback__ is None:
        return None
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= LAST_TRACEBACK_MAX else "…" + text[-(LAST_TRACEBACK_MAX - 1):]


def last_error(exc: object) -> str:
    """The :data:`LAST_ERROR` text of ``exc``: its type, its message, at most :data:`LAST_ERROR_MAX` characters."""
    text = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(exc)
    text = " ".join(text.split())  # one line: it is shown in tables
    return text if len(text) <= LAST_ERROR_MAX else text[:LAST_ERROR_MAX - 1] + "…"
