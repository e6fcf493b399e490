"""Django ``AppConfig`` that hooks the delay ladder into the project's Celery app."""

from __future__ import annotations

from django.apps import AppConfig


class DelayqConfig(AppConfig):
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

        from ..config import DelayqConfig as Settings
        from ..integration import install

        app = current_app._get_current_object()
        if Settings.from_app(app).enabled:
            install(app)
