"""Plain Celery tasks: with CELERY_DELAYQ_ENABLED their delays wait in the ladder, not in the worker."""
import time
from datetime import datetime, timezone

from celery import shared_task
from celery.utils.log import get_task_logger

log = get_task_logger(__name__)

#: Runs in this process (the tests read it when the worker runs in-process).
RUNS: list[dict] = []


@shared_task(bind=True)
def send_reminder(self, order_id: int, due: float) -> str:
    """Pretend to e-mail a reminder; say how late it ran against the time it was due."""
    RUNS.append({"order_id": order_id, "due": due, "at": time.time(), "eta": str(self.request.eta),
                 "entry": (self.request.headers or {}).get("x-delayq-entry")})
    # The due time with its offset, so the line reads the same whatever the log's own clock says.
    due_at = datetime.fromtimestamp(due, timezone.utc).isoformat(timespec="milliseconds")
    message = f"reminder for order {order_id} sent, {time.time() - due:.3f} s after it was due ({due_at})"
    log.info(message)
    return message
