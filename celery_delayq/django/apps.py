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

        from ..config import report_unknown_settings_elsewhere, setting
        from ..errors import SettingsError
        from ..glue.integration import install
        from .checks import check_broker_reachable, check_settings

        # Django keeps registered checks in a set: a second ready() (tests) adds nothing twice.
        checks.register(check_settings, "celery_delayq")
        checks.register(check_broker_reachable, "celery_delayq", deploy=True)

        app = current_app._get_current_object()
        # In a Django project the system checks report settings (W002/W003/E003; runserver and
        # migrate run them too): logging them here as well printed every finding twice.
        report_unknown_settings_elsewhere(app)
        try:
            enabled = setting(app, "enabled")
        except SettingsError as exc:
            # Must not crash `manage.py check`, which reports it (E003); any use of the ladder raises it.
            log.debug("celery_delayq is not installed: %s", exc)
            return
        if enabled:
            install(app)
