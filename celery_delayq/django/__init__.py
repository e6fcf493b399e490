"""Django integration: add ``"celery_delayq.django"`` to ``INSTALLED_APPS``.

Settings use Celery's Django namespace, e.g. ``CELERY_DELAYQ_ENABLED = True``
and ``CELERY_DELAYQ_UNIT_MS = 10`` next to ``CELERY_BROKER_URL``, with the
usual ``app.config_from_object("django.conf:settings", namespace="CELERY")``.

Django finds :class:`~celery_delayq.django.apps.DelayqAppConfig` by itself
(Django 3.2+), so there is no ``default_app_config``. ``manage.py check``
runs the checks of :mod:`celery_delayq.django.checks`.
"""
