"""The installed distribution's metadata: what pip and PyPI show a user (issue 9, item 8)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import amqp
import pytest


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


def _run(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.one_broker  # what is packaged does not depend on the RabbitMQ line
@pytest.mark.timeout(900)
def test_the_built_wheel_installs_in_a_clean_venv_and_runs_the_readme_example(
        make_app: Callable[..., Any], broker_url: str, prefix: str, uid: str, tmp_path: Path,
        amqp_conn: amqp.Connection) -> None:
    """``python -m build`` gives an sdist and a wheel that ``twine check`` passes; the wheel, installed
    alone into a new venv (no checkout on the path), runs the README's example against the real broker."""
    from test_readme_claims import readme_example_runs

    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(ROOT), cwd=tmp_path)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    version = importlib.metadata.version("celery_delayq")
    assert f"celery_delayq-{version}-py3-none-any.whl" == wheels[0].name
    _run(sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels + sdists), cwd=tmp_path)
    with zipfile.ZipFile(wheels[0]) as whl:
        names = set(whl.namelist())
    assert {"celery_delayq/py.typed", "celery_delayq/web/templates/base.html", "celery_delayq/web/templates/login.html",
            "celery_delayq/web/static/vendor/uplot/uPlot.iife.min.js", "celery_delayq/web/static/vendor/uplot/uPlot.min.css",
            "celery_delayq/web/static/vendor/uplot/LICENSE"} <= names  # the charts' library is served from the package
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    python = str(venv / "bin" / "python")
    _run(python, "-m", "pip", "install", "--quiet", str(wheels[0]), cwd=tmp_path)
    where = _run(python, "-c", "import celery_delayq, sys; print(celery_delayq.__file__)", cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where  # the installed wheel, not this checkout
    env = {k: val for k, val in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    readme_example_runs(python, env, make_app, broker_url, prefix, uid, tmp_path / "run", amqp_conn)


def test_the_support_matrix_is_what_the_readme_pyproject_and_ci_say() -> None:
    """The README's versions are tox.ini's envlist; pyproject claims no more; CI runs the matrix."""
    import configparser
    import re

    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    envlist = tox["tox"]["envlist"]
    pythons, celeries = re.fullmatch(r"py\{([\d,]+)\}-celery\{([\d,]+)\}", envlist).groups()  # type: ignore[union-attr]
    py = [f"3.{v[1:]}" for v in pythons.split(",")]
    cel = [f"5.{v[1:]}" for v in celeries.split(",")]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"Needs Python {py[0]}–{py[-1]}, Celery {cel[0]}–{cel[-1]} and RabbitMQ 3.10 or later" in readme
    assert "CI tests every Python × Celery pair" in readme and "Java 17" in readme
    for v, spec in zip(celeries.split(","), cel):
        assert f"celery{v}: celery[redis]>={spec},<5.{int(v[1:]) + 1}" in tox["testenv"]["deps"]
    meta = importlib.metadata.metadata("celery_delayq")
    versions = {c.rsplit(" :: ", 1)[1] for c in meta.get_all("Classifier") or []
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert versions == set(py)
    assert meta.get("Requires-Python") == f">={py[0]}"
    assert any(r.startswith("celery") and f">={cel[0]}" in r for r in meta.get_all("Requires-Dist") or [])
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./dev test --matrix\n" in ci
    assert "openjdk-17" in (ROOT / "dev").read_text()


@pytest.mark.pure
def test_the_version_is_one_and_the_changelog_has_it() -> None:
    """``__version__``, pyproject's version and the newest release heading of CHANGELOG.md agree."""
    import tomllib

    import celery_delayq

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert celery_delayq.__version__ == declared
    releases = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines()
                if line.startswith("## [") and not line.startswith("## [Unreleased]")]
    assert releases and releases[0].startswith(f"## [{declared}] - "), releases[:2]
