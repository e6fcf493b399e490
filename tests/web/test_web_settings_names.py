"""The page's own settings are known settings (never warned about as typos) and read in every spelling."""

from __future__ import annotations

from dataclasses import fields

from celery import Celery

from celery_delayq.config import FEATURE_SETTINGS, unknown_settings
from celery_delayq.web.settings import WebSettings

#: Fields of WebSettings that are no setting: a CLI flag, and a per-process secret.
NOT_SETTINGS = {"read_only", "csrf_secret"}


def test_the_page_reads_exactly_the_settings_config_knows() -> None:
    read = {f"delayq_web_{f.name}" for f in fields(WebSettings) if f.name not in NOT_SETTINGS}
    assert read == set(FEATURE_SETTINGS)


def test_web_settings_are_not_reported_as_typos_in_any_spelling() -> None:
    keys = [*FEATURE_SETTINGS, *(k.upper() for k in FEATURE_SETTINGS), *(f"CELERY_{k.upper()}" for k in FEATURE_SETTINGS)]
    assert unknown_settings(keys) == []
    assert unknown_settings(["delayq_web_tokn"]) == [("delayq_web_tokn", "delayq_web_token")]


def test_django_spelling_of_a_web_setting_is_read() -> None:
    app = Celery("websettings", set_as_current=False)
    app.config_from_object({"CELERY_DELAYQ_WEB_TOKEN": "t" * 20, "CELERY_DELAYQ_WEB_PAGE_MAX": "70"},
                           namespace="CELERY")
    settings = WebSettings.from_app(app, environ={})
    assert settings.token == "t" * 20 and settings.page_max == 70
