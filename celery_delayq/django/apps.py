"""Django ``AppConfig`` that hooks the delay ladder into the project's Celery app."""

from __future__ import annotations

import logging

from django.apps import AppConfig
from django.core import checks

__all__ = ["DelayqAppConfig"]

log = logging.getLogger(__name__)


class DelayqAppConfig(AppConfig):
    """Installs celery_delayq on the project's current Celery app once Django is ready.

    Why here: Django projects create their Celery app in ``proj/celery.py``
    and import it from ``proj/__init__.py``, so by ``ready()`` the app exists
    and its settings come from Django's. With ``CELERY_DELAYQ_ENABLED = True``
    every delayed publish of the project goes through the ladder;
    ``DelayedRetryTask`` tasks do regardless.
    """

    name = "celery_delayq.django"
    label = "celery_delayq"
    verbose_name = "Celery delay ladder"

    def ready(self) -> None:
        from celery import current_app

        from ..config import DelayqConfig
        from ..glue.integration import install
        from .checks import check_broker_reachable, check_settings

        checks.register(check_settings, "celery_delayq")
        checks.register(check_broker_reachable, "celery_delayq", deploy=True)

        app = current_app._get_current_object()
        try:
            enabled = DelayqConfig.from_app(app).enabled
        except (ValueError, TypeError) as exc:
            # Invalid settings must not crash `manage.py check`: it reports them (celery_delayq.E003).
            log.warning("celery_delayq is not installed: %s", exc)
            return
        if enabled:
            install(app)
