"""Make Celery's own revoke durable for tasks waiting in the ladder.

Celery's ``revoke`` is a broadcast to the workers running at that moment,
kept in their memory for three hours: a worker that restarts forgets it,
and a worker that was down never hears it. :func:`hook_revoke` wraps the
app's ``control.broadcast`` (which ``app.control.revoke``,
``AsyncResult.revoke`` and ``celery control revoke`` all go through) so that
a ``revoke`` is first recorded in the cancel log, confirmed, and then
broadcast as usual. Done per app by :func:`celery_delayq.install`, in the
process that revokes: that is where the revoke is known for certain, even
when no worker runs. The hook is given what records the revoke
(:func:`~celery_delayq.cancels.requests.record_cancels`, by the extension):
this module reads no index itself.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Iterable, Protocol

from ..typing import CeleryApp

__all__ = ["hook_revoke", "unhook_revoke", "RecordCancels"]

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
