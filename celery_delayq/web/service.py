"""What the page and the API read and do, on top of the package's own functions (no I/O of its own).

Every number comes from what the CLI uses: ``delayq status``'s
:func:`~celery_delayq.rabbitmq.status.ladder_status`, the doctor's
:func:`~celery_delayq.doctor.diagnose`, :func:`~celery_delayq.pending.pending`
(through :mod:`celery_delayq.pending.browse`), the parking queue's own
operations, :func:`~celery_delayq.cancel` and
:func:`~celery_delayq.cancels.supersede.reschedule`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..cancels import cancel
from ..cancels.supersede import Rescheduled, reschedule
from ..doctor import Finding
from ..parking import ParkedFilter, ParkedMessage, ParkingQueue
from ..pending.browse import Page, Snapshot, WaitingFilter, page_of
from ..pending.query import PendingTask
from .settings import WebSettings
from ..typing import CeleryApp

__all__ = ["Service", "BulkResult"]

log = logging.getLogger("celery_delayq.web")


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action matched, and did (nothing on a dry run)."""

    matched: int
    done: int
    dry_run: bool
    ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"matched": self.matched, "done": self.done, "dry_run": self.dry_run, "ids": self.ids[:100]}


class Service:
    """The page's view of one Celery app's delayed work."""

    #: Seconds the doctor's findings are reused (it asks every worker, which takes a second).
    DOCTOR_TTL = 30.0

    def __init__(self, app: CeleryApp, settings: WebSettings) -> None:
        from ..rabbitmq.context import AppContext

        self.app = app
        self.settings = settings
        self.context = AppContext(app)
        self.snapshot = Snapshot(app)
        self._doctor: tuple[float, list[Finding]] | None = None
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """``delayq status --json``'s document."""
        from ..rabbitmq.status import ladder_status

        with self.context.connected() as raw:
            return ladder_status(self.context, raw)

    def findings(self) -> list[Finding]:
        """The doctor's findings (reused for :attr:`DOCTOR_TTL` seconds)."""
        from ..doctor import diagnose

        with self._lock:
            if self._doctor is not None and time.monotonic() - self._doctor[0] < self.DOCTOR_TTL:
                return self._doctor[1]
        conn = self.context.connection()
        try:
            with self.context.connected() as raw:
                found = diagnose(self.app, conn, raw, self.context.config,
                                 parking_queue=self.context.parking_queue, inspect_timeout=0.5)
        finally:
            conn.release()
        with self._lock:
            self._doctor = (time.monotonic(), found)
        return found

    def telemetry(self) -> Any:
        """The last hour of telemetry (:class:`~celery_delayq.analytics.lasthour.LastHour`), None when off."""
        from ..analytics.lasthour import last_hour

        root = self.context.config.telemetry_dir
        return last_hour(root) if root else None

    def due_soon(self, now: float | None = None) -> dict[str, int]:
        """Waiting tasks due within the next minute and hour (from the index)."""
        now = time.time() if now is None else now
        every, _, _ = self.snapshot.get()
        return {"next_minute": sum(1 for t in every if now < t.due <= now + 60),
                "next_hour": sum(1 for t in every if now < t.due <= now + 3600),
                "retries": sum(1 for t in every if t.attempt > 0 and t.due > now)}

    def waiting(self, match: WaitingFilter, *, offset: int = 0, limit: int = 50) -> Page:
        """One page of waiting tasks."""
        return page_of(self.app, match, offset=offset, limit=limit, snapshot=self.snapshot)

    def parking(self) -> ParkingQueue:
        """The app's parking queue (the caller closes it)."""
        def ladder() -> Any:
            from ..glue.integration import install

            return install(self.app).publisher

        return ParkingQueue(self.context.connection(), self.context.parking_queue, ladder=ladder)

    def parked(self, match: ParkedFilter, *, limit: int = 50) -> tuple[list[ParkedMessage], int]:
        """Parked messages that match (oldest first, at most ``limit``), and how many are parked in all."""
        with self.parking() as pq:
            return pq.list(match, limit=limit), pq.count()

    def parked_one(self, parked_id: str) -> ParkedMessage:
        """One parked message by id (prefix)."""
        with self.parking() as pq:
            return pq.get(parked_id)

    # -- acting ----------------------------------------------------------------------------------
    def _acting(self) -> None:
        """Install the ladder on the app before the first action: a moved task or a delayed replay is
        published through it, and with ``delayq_telemetry_dir`` set the app's telemetry then records
        this process's replays (workers record the cancelled and superseded copies they drop)."""
        from ..glue.integration import install

        install(self.app)

    def cancel(self, task_ids: list[str], *, via: str) -> list[Any]:
        """Cancel tasks by id (:func:`celery_delayq.cancel`)."""
        self._acting()
        results = cancel(self.app, *task_ids)
        self._record("cancel", via, ids=task_ids)
        return results

    def cancel_matching(self, match: WaitingFilter, *, dry_run: bool, expect: int | None, via: str) -> BulkResult:
        """Cancel every waiting task that matches (a dry run only counts them).

        ``expect``: the count the operator confirmed; when the filter now matches a
        different number, nothing is cancelled (:class:`ValueError`).
        """
        page = page_of(self.app, match, offset=0, limit=10**9)  # fresh: never act on a kept list
        ids = [t.task_id for t in page.items]
        self._acting()
        if dry_run or not ids:
            return BulkResult(len(ids), 0, True if dry_run else False, ids)
        if expect is not None and expect != len(ids):
            raise ValueError(f"the filter now matches {len(ids)} task(s), not the {expect} confirmed; "
                             "count again (dry run) and confirm that number")
        cancel(self.app, *ids, lookup=False)
        self._record("cancel-matching", via, ids=ids, filter=match.describe())
        return BulkResult(len(ids), len(ids), False, ids)

    def reschedule(self, task_id: str, due: float | None, *, via: str) -> Rescheduled:
        """Run now (``due`` None) or move a waiting task (:func:`~celery_delayq.cancels.supersede.reschedule`)."""
        self._acting()
        done = reschedule(self.app, task_id, due=due)
        self._record("run-now" if due is None else "reschedule", via, ids=[task_id])
        return done

    def replay(self, match: ParkedFilter, *, delay: float | None, dry_run: bool, via: str) -> BulkResult:
        """Replay matching parked messages (a dry run only counts them)."""
        self._acting()
        with self.parking() as pq:
            found = pq.list(match)
            if dry_run or not found:
                return BulkResult(len(found), 0, dry_run, [p.parked_id for p in found])
            report = pq.replay(match, delay=delay)
        self._record("replay", via, ids=[p.parked_id for p in found], delay=delay)
        return BulkResult(len(found), report.replayed, False, [p.parked_id for p in found])

    def delete_parked(self, match: ParkedFilter, *, dry_run: bool, via: str) -> BulkResult:
        """Delete matching parked messages (a dry run only counts them)."""
        with self.parking() as pq:
            found = pq.list(match)
            if dry_run or not found:
                return BulkResult(len(found), 0, dry_run, [p.parked_id for p in found])
            deleted = pq.purge(match)
        self._record("delete-parked", via, ids=[p.parked_id for p in found])
        return BulkResult(len(found), deleted, False, [p.parked_id for p in found])

    def _record(self, action: str, via: str, **details: Any) -> None:
        """Log the action (the worker's telemetry records its effect: the cancel, the replayed run)."""
        self.snapshot.forget(details.get("ids") or [])  # gone from the page now; the index is read again
        log.warning("delayq web: %s via %s: %s", action, via,
                    ", ".join(f"{k}={v if not isinstance(v, list) else len(v)}" for k, v in details.items()))


def pending_dict(t: PendingTask, now: float, *, body_max: int) -> dict[str, Any]:
    """A waiting task as the API shows it (argument text cut at ``body_max``)."""
    doc = t.as_dict()
    for key in ("args", "kwargs"):
        if isinstance(doc.get(key), str) and len(doc[key]) > body_max:
            doc[key] = doc[key][:body_max] + "…"
    doc["in_s"] = round(t.due - now, 3)
    doc["retry"] = t.attempt > 0
    return doc
