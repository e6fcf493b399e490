"""The package's import graph: no cycles, and the lower layers never import the hook.

A reader follows ``apply_async(countdown=...)`` down from the hook
(``integration`` → ``producer`` → ``app_ladder`` → ``publisher``) without
meeting a call back up a layer. Imports inside functions count too: a
function-level import is still a dependency, only a deferred one.
``if TYPE_CHECKING:`` blocks do not count (they never run). Pure: reads the
source with :mod:`ast`, imports nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "celery_delayq"
#: The modules above the hook: they may import it (the CLI, the Django app, the doctor, tasks).
ABOVE_THE_HOOK = ("celery_delayq.cli", "celery_delayq.django", "celery_delayq.doctor", "celery_delayq.glue.task",
                  "celery_delayq.glue.integration", "celery_delayq.analytics", "celery_delayq.rabbitmq.export",
                  "celery_delayq.web")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    type_only = {id(node) for test in ast.walk(tree)
                 if isinstance(test, ast.If) and "TYPE_CHECKING" in ast.unparse(test.test)
                 for stmt in test.body for node in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in type_only]


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports (``from pkg import submodule`` is an edge to the submodule)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in paths] + ([base] if not all(s in paths for s in subs) else [])
            else:
                targets = [a.name for a in node.names]
            graph[module].update(t for t in targets if t in paths and t != module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_below_the_hook_nothing_imports_the_hook() -> None:
    graph = import_graph()
    offenders = sorted(m for m, deps in graph.items()
                       if "celery_delayq.glue.integration" in deps and not m.startswith(ABOVE_THE_HOOK)
                       and m != "celery_delayq")
    assert offenders == []


def test_the_producer_hook_depends_only_on_its_protocols() -> None:
    """The producer asks a typed Protocol whether a publish is delayed; it imports no ladder code."""
    assert import_graph()["celery_delayq.glue.producer"] <= {"celery_delayq.typing", "celery_delayq.ladder.plugin_compat"}
