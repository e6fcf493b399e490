"""The public surface: ``__all__``, its reference in ``docs/api.md``, the settings table, ``py.typed``. Pure."""

from __future__ import annotations

import importlib.util
import inspect
import re
import tomllib
from pathlib import Path
from types import ModuleType

import celery_delayq
from celery_delayq.config import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"


def _gen_settings() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "docs" / "gen_settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented_names() -> list[str]:
    """First-column names of the tables above the settings table."""
    text = API_MD.read_text(encoding="utf-8").split("## Settings", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE)


def test_all_names_exist_once_and_have_docstrings() -> None:
    names = celery_delayq.__all__
    assert len(names) == len(set(names))
    for name in names:
        obj = getattr(celery_delayq, name)
        assert inspect.getdoc(obj), f"{name} has no docstring"


def test_users_can_reach_what_they_write_and_catch() -> None:
    for name in ("signals", "BrokerUnavailable", "ladder_for", "is_installed", "AppLadder", "LadderProducer",
                 "pending", "cancel", "IndexUnavailable", "ParkingFailed"):
        assert name in celery_delayq.__all__
    assert celery_delayq.signals.message_scheduled is not None
    for name in celery_delayq.__all__:
        obj = getattr(celery_delayq, name)
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj is not celery_delayq.RetryAfter:
            assert issubclass(obj, celery_delayq.DelayqError), name


def test_api_reference_lists_every_public_name_and_nothing_else() -> None:
    documented = _documented_names()
    assert sorted(documented) == sorted(celery_delayq.__all__)


def test_settings_table_is_generated_from_the_settings() -> None:
    gen = _gen_settings()
    assert gen.main(["--check"]) == 0, "docs/api.md is stale: run python docs/gen_settings.py"
    table = gen.render()
    for key in SETTINGS:
        assert f"| `{key}` |" in table


def test_every_setting_is_described_in_the_config_docstring() -> None:
    gen = _gen_settings()
    about = gen.descriptions()
    assert set(about) == {key[len("delayq_"):] for key in SETTINGS}
    assert all(text and "``" not in text for text in about.values())


def test_py_typed_is_shipped() -> None:
    assert (Path(celery_delayq.__file__).parent / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["celery_delayq"]
