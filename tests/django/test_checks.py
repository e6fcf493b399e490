"""`manage.py check` on the example project flags what would otherwise fail late (real subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("django")

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_shop"


def manage(tmp_path: Path, *args: str, settings: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py ARGS`` of the example project, with extra settings appended to its own."""
    (tmp_path / "variant_settings.py").write_text("from shop.settings import *  # noqa: F401,F403\n"
                                                  + textwrap.dedent(settings))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "DJANGO_"))}
    full = dict(base, DJANGO_SETTINGS_MODULE="variant_settings",
                PYTHONPATH=os.pathsep.join([str(tmp_path), str(PROJECT), os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.run([sys.executable, str(PROJECT / "manage.py"), *args], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_the_example_project_passes(tmp_path: Path) -> None:
    out = manage(tmp_path, "check")
    assert out.returncode == 0, out.stderr
    assert "System check identified no issues" in out.stdout
    assert "celery_delayq" not in out.stdout + out.stderr


def test_a_missing_broker_is_flagged(tmp_path: Path) -> None:
    out = manage(tmp_path, "check", settings="del CELERY_BROKER_URL\n")
    assert "(celery_delayq.W001) No broker is configured" in out.stderr, out.stderr
    assert "CELERY_BROKER_URL" in out.stderr
    assert out.returncode == 0  # a warning: development setups run on the default broker
    strict = manage(tmp_path, "check", "--fail-level", "WARNING", settings="del CELERY_BROKER_URL\n")
    assert strict.returncode == 1


def test_a_non_amqp_transport_is_an_error(tmp_path: Path) -> None:
    out = manage(tmp_path, "check", CELERY_BROKER_URL="redis://localhost:6379/0")
    assert out.returncode == 1
    assert "(celery_delayq.E001)" in out.stderr and "'redis' transport" in out.stderr
    assert "CELERY_DELAYQ_BROKER_URL" in out.stderr  # the way out: a RabbitMQ for the ladder only
    assert "Traceback" not in out.stderr


def test_a_separate_ladder_broker_makes_another_task_broker_fine(tmp_path: Path) -> None:
    out = manage(tmp_path, "check", settings='CELERY_DELAYQ_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"\n',
                 CELERY_BROKER_URL="redis://localhost:6379/0")
    assert out.returncode == 0, out.stderr
    bad = manage(tmp_path, "check", settings='CELERY_DELAYQ_BROKER_URL = "sqs://"\n')
    assert bad.returncode == 1 and "(celery_delayq.E001)" in bad.stderr
    assert "Point CELERY_DELAYQ_BROKER_URL at RabbitMQ" in bad.stderr


def test_unknown_keys_are_flagged_with_the_closest_valid_one(tmp_path: Path) -> None:
    out = manage(tmp_path, "check", settings="""
        CELERY_DELAYQ_ENABLD = True
        CELERY_DELAYQ_UNIT = 5
        CELERY_DELAYQ_FROBNICATE = 1
        DELAYQ_PREFIX = "other"
    """)
    assert out.returncode == 0, out.stderr  # warnings
    err = out.stderr
    assert "CELERY_DELAYQ_ENABLD: (celery_delayq.W002)" in err and "Did you mean CELERY_DELAYQ_ENABLED?" in err
    assert "Did you mean CELERY_DELAYQ_UNIT_MS?" in err
    assert "CELERY_DELAYQ_FROBNICATE: (celery_delayq.W002)" in err
    assert "DELAYQ_PREFIX: (celery_delayq.W003)" in err and "Rename it to CELERY_DELAYQ_PREFIX." in err
    assert "CELERY_DELAYQ_PREFIX:" not in err and "CELERY_DELAYQ_UNIT_MS:" not in err  # valid keys pass


def test_an_unusable_value_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    out = manage(tmp_path, "check", settings="CELERY_DELAYQ_LEVELS = 0\n")
    assert out.returncode == 1
    assert "CELERY_DELAYQ_LEVELS: (celery_delayq.E003)" in out.stderr
    assert "delayq_levels must be an integer 1 or more, got 0" in out.stderr
    assert "Traceback" not in out.stderr


#: Values as Django settings fed from the environment give them: (settings, refused by run time and check?).
VALUES = {
    'CELERY_DELAYQ_ENABLED = "false"\n': None,
    'CELERY_DELAYQ_ENABLED = "0"\nCELERY_DELAYQ_UNIT_MS = "10"\nCELERY_DELAYQ_CONFIRM_TIMEOUT = "2.5"\n': None,
    'CELERY_DELAYQ_ENABLED = "yes please"\n': "CELERY_DELAYQ_ENABLED",
    'CELERY_DELAYQ_UNIT_MS = "ten"\n': "CELERY_DELAYQ_UNIT_MS",
    'CELERY_DELAYQ_CONFIRM_TIMEOUT = float("nan")\n': "CELERY_DELAYQ_CONFIRM_TIMEOUT",
    'CELERY_DELAYQ_QUEUE_TYPE = "Quorum"\n': "CELERY_DELAYQ_QUEUE_TYPE",
    'CELERY_DELAYQ_DECLARE = 2\n': "CELERY_DELAYQ_DECLARE",
}

#: What the run time makes of the same settings: the config the publishers and the worker build.
RUN_TIME = ("from celery import current_app; from celery_delayq.config import DelayqConfig\n"
            "try:\n    c = DelayqConfig.from_app(current_app._get_current_object())\n"
            "except ValueError as exc:\n    print('REFUSED', exc)\nelse:\n    print('OK', c.enabled, c.unit_ms)")


@pytest.mark.parametrize("settings,refused", list(VALUES.items()), ids=[s.split("\n")[0] for s in VALUES])
def test_check_refuses_exactly_what_the_run_time_refuses_once(tmp_path: Path, settings: str,
                                                              refused: str | None) -> None:
    check = manage(tmp_path, "check", settings=settings)
    run = manage(tmp_path, "shell", "-c", RUN_TIME, settings=settings)
    assert run.returncode == 0, run.stderr
    if refused is None:
        assert check.returncode == 0, check.stderr
        assert "OK False" in run.stdout, run.stdout
        return
    assert check.returncode == 1 and "Traceback" not in check.stderr
    (line,) = [x for x in check.stderr.splitlines() if "celery_delayq" in x]  # once: no log line beside it
    assert line.startswith(f"{refused}: (celery_delayq.E003) celery_delayq cannot use these settings: ")
    message = line.split("cannot use these settings: ", 1)[1]
    assert f"REFUSED {message}" in run.stdout  # the very same error, from the very same code


def test_a_false_string_does_not_turn_the_ladder_on(tmp_path: Path) -> None:
    show = ("from celery import current_app; import celery_delayq; "
            "print('INSTALLED', celery_delayq.is_installed(current_app._get_current_object()))")
    off = manage(tmp_path, "shell", "-c", show, settings='CELERY_DELAYQ_ENABLED = "false"\n')
    on = manage(tmp_path, "shell", "-c", show, settings='CELERY_DELAYQ_ENABLED = "true"\n')
    assert "INSTALLED False" in off.stdout, off.stderr
    assert "INSTALLED True" in on.stdout, on.stderr


def test_each_finding_is_printed_once(tmp_path: Path) -> None:
    out = manage(tmp_path, "check", settings="CELERY_DELAYQ_ENABLD = True\n")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("CELERY_DELAYQ_ENABLD") == 2  # the finding's object and its message, one finding
    assert "unknown setting" not in out.stderr  # the run-time log line said it a second time


def test_a_management_url_password_is_never_printed(tmp_path: Path) -> None:
    bad = manage(tmp_path, "check", settings='CELERY_DELAYQ_MANAGEMENT_URL = "monitor:hunter2secret@rabbit:15672"\n')
    assert bad.returncode == 1 and "CELERY_DELAYQ_MANAGEMENT_URL: (celery_delayq.E003)" in bad.stderr
    assert "hunter2secret" not in bad.stdout + bad.stderr and "'monitor:**@rabbit:15672'" in bad.stderr
    good = manage(tmp_path, "check", settings='CELERY_DELAYQ_MANAGEMENT_URL = "http://monitor:hunter2secret@rabbit:15672"\n')
    assert good.returncode == 0, good.stderr


def test_check_deploy_connects_to_the_broker(tmp_path: Path, broker_url: str) -> None:
    down = manage(tmp_path, "check", "--deploy", "--tag", "celery_delayq",
                  CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:1//")
    assert down.returncode == 1
    assert ("(celery_delayq.E002) celery_delayq cannot connect to the broker "
            "amqp://guest:**@127.0.0.1:1//") in down.stderr
    up = manage(tmp_path, "check", "--deploy", "--tag", "celery_delayq", CELERY_BROKER_URL=broker_url)
    assert up.returncode == 0, up.stderr
    plain = manage(tmp_path, "check", CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:1//")
    assert plain.returncode == 0, plain.stderr  # the default checks do no I/O


SHOW_CONFIG = ("from django.apps import apps; c = apps.get_app_config('celery_delayq'); "
               "print(type(c).__module__, type(c).__name__)")


def test_django_finds_the_app_config_by_itself(tmp_path: Path) -> None:
    out = manage(tmp_path, "shell", "-c", SHOW_CONFIG)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["celery_delayq.django.apps", "DelayqAppConfig"]
    import celery_delayq.django

    assert not hasattr(celery_delayq.django, "default_app_config")
