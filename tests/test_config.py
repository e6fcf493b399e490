"""Settings: unknown ``delayq_*`` keys are reported once per app, with the closest valid key."""

from __future__ import annotations

import logging

import pytest
from celery import Celery

from celery_delayq.config import DelayqConfig, unknown_settings


def test_unknown_keys_in_every_spelling_get_the_closest_valid_key() -> None:
    keys = ["delayq_enable", "DELAYQ_LEVEL", "CELERY_DELAYQ_PERFIX", "delayq_prefix", "CELERY_DELAYQ_RADIX",
            "broker_url", "delayq_frobnicate", "PROJ_DELAYQ_ENABLED"]
    assert unknown_settings(keys) == [
        ("delayq_enable", "delayq_enabled"),
        ("DELAYQ_LEVEL", "DELAYQ_LEVELS"),
        ("CELERY_DELAYQ_PERFIX", "CELERY_DELAYQ_PREFIX"),
        ("delayq_frobnicate", None),
    ]
    assert unknown_settings(["PROJ_DELAYQ_ENABLE"], namespace="PROJ") == [("PROJ_DELAYQ_ENABLE", "PROJ_DELAYQ_ENABLED")]


def test_warns_once_per_app(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("cfg", set_as_current=False)
    app.conf.update(delayq_enable=True, delayq_prefix="ok")
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        assert DelayqConfig.from_app(app).prefix == "ok"
        DelayqConfig.from_app(app)
    warnings = [r.getMessage() for r in caplog.records if r.name == "celery_delayq.config"]
    assert warnings == ["celery_delayq: unknown setting 'delayq_enable' is ignored; did you mean 'delayq_enabled'?"]
    caplog.clear()
    other = Celery("cfg2", set_as_current=False)
    other.conf.update(delayq_enable=True)
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        DelayqConfig.from_app(other)
    assert len([r for r in caplog.records if r.name == "celery_delayq.config"]) == 1


def test_django_namespace_spelling_is_checked(caplog: pytest.LogCaptureFixture) -> None:
    class Settings:
        CELERY_DELAYQ_ENABLE = True
        CELERY_DELAYQ_PREFIX = "dj"

    app = Celery("cfgdj", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        assert DelayqConfig.from_app(app).prefix == "dj"
    assert "did you mean 'CELERY_DELAYQ_ENABLED'?" in caplog.text


def test_valid_settings_are_quiet(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("cfgok", set_as_current=False)
    app.conf.update(delayq_enabled=True, DELAYQ_LEVELS=12)
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        assert DelayqConfig.from_app(app).levels == 12
    assert not [r for r in caplog.records if r.name == "celery_delayq.config"]
