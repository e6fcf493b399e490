"""Plain Celery tasks: with CELERY_DELAYQ_ENABLED their delays wait in the ladder."""
import time

from celery import shared_task

RUNS: list[dict] = []


@shared_task(bind=True)
def send_reminder(self, order_id: int, due: float) -> None:
    RUNS.append({"order_id": order_id, "due": due, "at": time.time(), "eta": str(self.request.eta),
                 "entry": (self.request.headers or {}).get("x-delayq-entry")})
