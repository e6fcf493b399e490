"""Make Celery's own revoke durable for tasks waiting in the ladder, and tell workers of this package's cancels.

:func:`hook_revoke` wraps the app's ``control.broadcast`` so that a ``revoke`` is recorded in the cancel log
(by the ``record_cancels`` it is given: this module reads no index), confirmed, before it is broadcast.
:func:`tell_workers` sends Celery's ``revoke`` for a cancel recorded here (``delayq cancel``, the page, a
move's pass cancel), so running workers drop it even when their log follower is behind. docs/cancel.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Iterable, Protocol

from ..typing import CeleryApp

__all__ = ["hook_revoke", "unhook_revoke", "RecordCancels", "tell_workers", "TOLD_WITHIN_S", "TOLD_MAX"]

#: Only cancels of deliveries due within this many seconds are broadcast: a follower is behind for
#: seconds to minutes, and Celery's workers keep a revoked id for 3 hours (``REVOKE_EXPIRES``).
TOLD_WITHIN_S = 3600.0
#: At most this many ids per broadcast (a worker keeps the last 50,000 revoked ids, ``REVOKES_MAX``).
TOLD_MAX = 10_000

_ORIGINAL = "_delayq_original"

log = logging.getLogger(__name__)


class RecordCancels(Protocol):
    """What records revoked ids in the app's cancel log (:func:`~celery_delayq.cancels.requests.record_cancels`)."""

    def __call__(self, app: CeleryApp, task_ids: Iterable[str], *, lookup: bool = ..., reason: str = ...) -> object:
        ...


def hook_revoke(app: CeleryApp, record_cancels: RecordCancels) -> None:
    """Record (with ``record_cancels``) every ``revoke`` of ``app`` in its cancel log before broadcasting it
    (idempotent)."""
    control = app.control
    original = control.broadcast
    if hasattr(original, _ORIGINAL):
        return

    @functools.wraps(original)
    def broadcast(command: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if command == "revoke" and arguments and arguments.get("task_id"):
            ids = arguments["task_id"]
            ids = [ids] if isinstance(ids, str) else list(ids)
            try:
                # Looked up, so a revoke of a task due beyond the ladder's span holds until it is due.
                record_cancels(app, ids, lookup=True, reason="revoked")
            except Exception as exc:  # noqa: BLE001 - Celery's own revoke still goes out, as without us
                log.error("delayq: revoke of %s is NOT durable (the cancel log could not record it: %s); "
                          "workers that restart, or that are down now, will not know it", ", ".join(ids), exc)
        return original(command, arguments, *args, **kwargs)

    setattr(broadcast, _ORIGINAL, original)
    control.broadcast = broadcast


def unhook_revoke(app: CeleryApp) -> None:
    """Undo :func:`hook_revoke`."""
    control = app.__dict__.get("control")
    if control is None:
        return
    original = getattr(control.__dict__.get("broadcast"), _ORIGINAL, None)
    if original is not None:
        del control.broadcast


def tell_workers(app: CeleryApp, dues: Iterable[tuple[str, float | None]], *, timeout: float,
                 now: float | None = None) -> bool:
    """Broadcast Celery's ``revoke`` of the ids (task ids, or ladder pass ids) due within :data:`TOLD_WITHIN_S`.

    ``dues``: ``(id, due time)`` pairs; a due time of ``None`` (not known) counts as due now. The soonest
    :data:`TOLD_MAX` go out. A second, faster path beside the cancel log (which must already hold the
    cancels): a worker whose log follower is behind drops the delivery all the same. A pass id in the
    revoked set names no task, so only :func:`~celery_delayq.cancels.worker.drop_if_superseded` reads
    it. Best effort, bounded by ``timeout``; returns whether the broadcast went out (or had nothing to say).
    """
    now = time.time() if now is None else now
    soon = sorted((now if due is None else due, i) for i, due in dues)
    ids = [i for due, i in soon if due <= now + TOLD_WITHIN_S][:TOLD_MAX]
    if not ids:
        return True
    control = app.control
    send = getattr(control.broadcast, _ORIGINAL, control.broadcast)  # not recorded again by the hook
    failed: list[BaseException] = []

    def run() -> None:
        try:
            send("revoke", arguments={"task_id": ids, "terminate": False, "signal": None})
        except Exception as exc:  # noqa: BLE001 - said below; the log still holds the cancels
            failed.append(exc)

    thread = threading.Thread(target=run, name="delayq-tell-workers", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or failed:
        log.warning("delayq: running workers were not told at once of %d cancel(s) (%s); they drop them "
                    "once their cancel log follower has read them", len(ids),
                    repr(failed[0]) if failed else f"no broker answer in {timeout:.0f} s")
        return False
    return True
