"""The report is outside ``mypy --strict`` (PySpark's loose types): every name its modules use must be bound.

A coarse check mypy would do: a name read anywhere in a module must be bound somewhere in it (an import, a
definition, an assignment, an argument) or be a builtin. It caught ``_window_text``, removed while two error
messages still called it.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import celery_delayq.analytics

MODULES = sorted(Path(celery_delayq.analytics.__file__).parent.glob("*.py"))


def unbound_names(source: str) -> set[str]:
    tree = ast.parse(source)
    bound = set(dir(builtins)) | {"__file__", "__name__", "__doc__"}
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound


def test_the_check_finds_an_unbound_name():
    assert unbound_names("import os\ndef f(a):\n    return os.sep + a + _gone(a)\n") == {"_gone"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_name_a_report_module_reads_is_bound(path):
    assert unbound_names(path.read_text()) == set()
