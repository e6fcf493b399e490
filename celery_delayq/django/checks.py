"""Django system checks (``manage.py check``) for celery_delayq's settings: what would fail late, said at start.

A misspelt or un-namespaced ``CELERY_DELAYQ_*`` setting, a value it cannot use, no broker URL or one that
is not RabbitMQ; ``check --deploy`` also connects to the broker (the default checks do no I/O). The check
ids and what each reports: docs/api.md ("Django system checks").
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from kombu.transport import TRANSPORT_ALIASES

from ..config import DelayqConfig, mask_url, report_unknown_settings_elsewhere, unknown_settings
from ..typing import CeleryApp

__all__ = ["check_settings", "check_broker_reachable", "broker_url_of", "transport_problem"]

#: kombu transports the ladder runs on: py-amqp, the only client with the confirms it uses.
_AMQP_TRANSPORTS = ("kombu.transport.pyamqp:Transport", "kombu.transport.pyamqp:SSLTransport")


def _celery_app() -> Any:
    from celery import current_app

    return current_app._get_current_object()


def broker_url_of(app: CeleryApp, config: DelayqConfig | None) -> str | None:
    """The broker the ladder uses: ``delayq_broker_url``, else the app's write broker URL."""
    if config is not None and config.broker_url:
        return str(config.broker_url)
    url = app.conf.broker_write_url or app.conf.broker_url
    return str(url) if url else None


def transport_problem(url: str) -> str | None:
    """Why the ladder cannot run over ``url``'s transport, or ``None`` when it can.

    Decided from the URL scheme alone, so that a check never imports (or
    fails to import) another transport's client library.
    """
    first = url.split(";")[0].strip()
    scheme = first.split("://", 1)[0].lower() if "://" in first else first.lower()
    target = TRANSPORT_ALIASES.get(scheme, scheme)
    if target in _AMQP_TRANSPORTS:
        return None
    return (f"the broker URL uses the {scheme!r} transport; the delay ladder lives in RabbitMQ "
            "and needs AMQP 0-9-1 through py-amqp")


def _namespace(app: CeleryApp) -> str:
    return (getattr(app, "namespace", None) or "CELERY").upper()


def _unknown_keys(app: CeleryApp) -> list[CheckMessage]:
    namespace = _namespace(app)
    names = [name for name in dir(settings) if name.isupper()]
    unknown = dict(unknown_settings(names, namespace))
    out: list[CheckMessage] = []
    for name in sorted(names):
        if name.startswith(f"{namespace}_DELAYQ_") and name in unknown:
            best = unknown[name]
            out.append(Warning(
                f"{name} is not a celery_delayq setting, so it is ignored.",
                hint=f"Did you mean {best}?" if best else "The settings are listed in celery_delayq.config.SETTINGS.",
                obj=name, id="celery_delayq.W002"))
        elif name.startswith("DELAYQ_") and getattr(app, "namespace", None):
            # Celery loads only the namespaced names from Django's settings.
            fixed = unknown[name] if name in unknown else name  # misspelt too: the closest valid key
            out.append(Warning(
                f"{name} is never read: Celery reads Django settings under the {namespace!r} namespace.",
                hint=f"Rename it to {namespace}_{fixed or name}.",
                obj=name, id="celery_delayq.W003"))
    return out


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Unknown ``CELERY_DELAYQ_*`` keys, unusable values, and a missing or non-AMQP broker."""
    app = _celery_app()
    report_unknown_settings_elsewhere(app)  # W002/W003 below say it; the run-time log would repeat it
    out = _unknown_keys(app)
    config: DelayqConfig | None = None
    try:
        config = DelayqConfig.from_app(app)  # the very code the worker and publishers run
    except (ValueError, TypeError) as exc:
        name = getattr(exc, "setting", None)
        django_name = f"{_namespace(app)}_{name.upper()}" if name else None
        out.append(Error(f"celery_delayq cannot use these settings: {exc}",
                         hint=f"Fix {django_name}." if django_name else "Fix the CELERY_DELAYQ_* setting the "
                         "message names.", obj=django_name, id="celery_delayq.E003"))
    url = broker_url_of(app, config)
    if not url:
        out.append(Warning(
            "No broker is configured, so Celery falls back to amqp://guest@localhost//.",
            hint="Set CELERY_BROKER_URL = 'amqp://USER:PASSWORD@HOST:5672/VHOST' (the ladder needs RabbitMQ), "
                 "and load it with app.config_from_object('django.conf:settings', namespace='CELERY').",
            id="celery_delayq.W001"))
        return out
    problem = transport_problem(url)
    if problem:
        which = "CELERY_DELAYQ_BROKER_URL" if config is not None and config.broker_url else "CELERY_BROKER_URL"
        out.append(Error(
            f"celery_delayq: {problem}.",
            hint=f"Point {which} at RabbitMQ (amqp://...). To keep another broker for tasks, "
                 "set CELERY_DELAYQ_BROKER_URL to a RabbitMQ for the ladder.",
            id="celery_delayq.E001"))
    return out


def check_broker_reachable(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``check --deploy``: the ladder's broker accepts a connection (a few seconds at most)."""
    import kombu

    app = _celery_app()
    try:
        url = broker_url_of(app, DelayqConfig.from_app(app))
    except (ValueError, TypeError):
        return []  # reported by check_settings
    if not url or transport_problem(url):
        return []
    conn = kombu.Connection(url, connect_timeout=3)
    try:
        conn.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:  # any failure to connect is the finding
        return [Error(f"celery_delayq cannot connect to the broker {mask_url(conn.as_uri())}: {exc}",
                      hint="Start RabbitMQ or fix CELERY_BROKER_URL (host, port, vhost, credentials).",
                      id="celery_delayq.E002")]
    finally:
        conn.release()
    return []
