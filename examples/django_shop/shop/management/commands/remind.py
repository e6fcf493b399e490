"""``manage.py remind ORDER_ID --in SECONDS``: schedule a reminder the Celery way (a countdown)."""
import time
from datetime import datetime, timezone

from django.core.management.base import BaseCommand

from shop.tasks import send_reminder


class Command(BaseCommand):
    help = "Schedule a reminder for an order; with CELERY_DELAYQ_ENABLED it waits in RabbitMQ."

    def add_arguments(self, parser):
        parser.add_argument("order_id", type=int)
        parser.add_argument("--in", dest="seconds", type=float, default=5.0,
                            help="seconds from now (default 5)")

    def handle(self, order_id: int, seconds: float, **options):
        due = time.time() + seconds
        result = send_reminder.apply_async((order_id, due), countdown=seconds)
        at = datetime.fromtimestamp(due, timezone.utc).isoformat(timespec="seconds")
        self.stdout.write(f"order {order_id}: reminder due at {at} (task {result.id})")
