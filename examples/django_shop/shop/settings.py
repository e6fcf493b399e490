"""Minimal Django settings for the celery_delayq example project."""
import os

SECRET_KEY = "example-only-not-secret"
DEBUG = True
USE_TZ = True
# Django's default TIME_ZONE is America/Chicago, and Django sets the process's TZ from it: the
# worker's log lines would read hours off the UTC due times that `remind` and `delayq` print.
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "celery_delayq.django", "shop"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
CELERY_BROKER_HEARTBEAT = 0
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("SHOP_QUEUE", "shop")
# celery_delayq: every countdown/eta/retry of the project waits in RabbitMQ
CELERY_DELAYQ_ENABLED = True
CELERY_DELAYQ_PREFIX = os.environ.get("SHOP_DELAYQ_PREFIX", "shop_delayq")
CELERY_DELAYQ_UNIT_MS = 10
# RabbitMQ's management API (status, doctor, topology delete); unset = http://<broker host>:15672
CELERY_DELAYQ_MANAGEMENT_URL = os.environ.get("SHOP_DELAYQ_MANAGEMENT_URL")
