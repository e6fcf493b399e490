"""The installed distribution's metadata: what pip and PyPI show a user (issue 9, item 8)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def test_license_is_an_spdx_expression_with_its_file_shipped() -> None:
    meta = importlib.metadata.metadata("celery_delayq")
    assert meta.get("License-Expression") == "BSD-3-Clause"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert "Redistribution and use in source and binary forms" in (ROOT / "LICENSE").read_text()
    # PEP 639: no License :: classifier beside an expression (setuptools refuses the pair).
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]


def test_python_and_framework_classifiers_match_what_is_supported() -> None:
    meta = importlib.metadata.metadata("celery_delayq")
    classifiers = set(meta.get_all("Classifier") or [])
    assert meta.get("Requires-Python") == ">=3.11"
    assert {"Programming Language :: Python :: 3.11", "Framework :: Celery", "Framework :: Django"} <= classifiers
    assert not [c for c in classifiers if c.startswith("Programming Language :: Python :: 3.") and
                int(c.rsplit(".", 1)[1]) < 11]
