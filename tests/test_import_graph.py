"""The package's import graph: the layers of the tree, in order, and no cycle.

The tree names the layers, bottom up: ``ladder/`` (pure arithmetic, names
and headers), the root's settings and seams (``errors``, ``signals``,
``typing``, ``config``), ``policies/`` (the pure retry decision),
``rabbitmq/`` (the broker edge), ``glue/`` (the Celery glue), then the
features and the CLI. A layer imports only the layers below it; the glue
reaches a feature only as an extension (named by a ``"module:Class"`` string in
:data:`celery_delayq.glue.extensions.EXTENSIONS`, never imported); a feature
that reads another's output sits above it (``analytics`` reads what
``telemetry`` writes); nothing imports the CLI. A reader follows
``apply_async(countdown=...)`` down from the hook (``glue.integration`` →
``glue.producer`` → ``glue.app_ladder`` → ``rabbitmq.publisher``) without
meeting a call back up a layer. Imports inside functions count too: a
function-level import is still a dependency, only a deferred one. Imports
under ``if TYPE_CHECKING:`` count for the cycle test and the layer order (a
type-only cycle is still a knot a reader must untie); they are kept apart so
the runtime graph stays what runs. Pure: reads the source with :mod:`ast`,
imports nothing.

Two numbers keep the tree flat: no loop between sub-packages (a folder that
imports another imports nothing back from it), and the longest chain of
runtime imports (a module importing one that imports another, and so on), at
most :data:`MAX_CHAIN` modules; below the web page, the CLI and the pytest
plugin at most :data:`MAX_CHAIN_BELOW_WEB`. A failure prints the chain.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "celery_delayq"
#: The layers below the glue, bottom up: each may import itself and the layers before it.
#: The ground is what every layer names (errors, signals, the seams' Protocols); it imports nothing.
GROUND = ("celery_delayq.errors", "celery_delayq.signals", "celery_delayq.typing")
LADDER = ("celery_delayq.ladder",)
SETTINGS = ("celery_delayq.config",)
#: The retry decision: pure (tenacity strategies and options resolved from the settings), no I/O.
POLICIES = ("celery_delayq.policies",)
EDGE = ("celery_delayq.rabbitmq",)
#: Above every delay backend: the index writer and the scheduler that builds, chooses and calls the backends.
SCHEDULING = ("celery_delayq.index.writer", "celery_delayq.scheduling")
GLUE = ("celery_delayq.glue",)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", GROUND), ("ladder", LADDER), ("settings", SETTINGS), ("policies", POLICIES), ("edge", EDGE),
    ("scheduling", SCHEDULING), ("glue", GLUE))
#: The command lines, ``celery -A APP delayq`` (its ``report`` is the analytics' own command, :mod:`celery_delayq.analytics.command`).
CLI = ("celery_delayq.cli",)
#: The web page and its API (``celery -A APP delayq web``).
WEB = ("celery_delayq.web",)
#: The top floors, which only use the library: the web page, the CLI and the pytest plugin (it imports the
#: package root, so that ``delayq_enabled`` works in a test suite).
TOP = WEB + CLI + ("celery_delayq.pytest_plugin",)
#: Package-level knots among the features still to untie, each with its reason. Only these may remain.
KNOWN_FEATURE_KNOTS: list[list[str]] = []
#: The longest import chain, in modules (the goal of #32). ``cli -> cli.web -> web -> web.api.* -> web.errors``
#: are five modules before the first feature; then an action (``cancels.reschedule``) reaches the glue
#: (``glue.integration -> glue.app_ladder``), the ladder's backend (``rabbitmq.publisher``) and the settings
#: (``config -> ladder.spec -> errors``): 12. The confirm channel and the dedicated connection that carries it
#: are one module (``rabbitmq.confirms``), and ``broker_version`` lives with the client, so the index and its
#: writer sit three modules above ``errors``.
MAX_CHAIN = 12
#: The same below the entry points (:data:`TOP`: the web page, the CLI, the pytest plugin, left out): the cancel
#: action over the index readers, ``cancels -> cancels.extension -> cancels.requests -> index.lookup -> index.ids
#: -> index.query -> index.stream -> rabbitmq.client -> errors``.
MAX_CHAIN_BELOW_WEB = 9


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, *, type_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run (``type_only=False``), or also those under ``if TYPE_CHECKING:``."""
    guarded = {id(node) for test in ast.walk(tree)
               if isinstance(test, ast.If) and "TYPE_CHECKING" in ast.unparse(test.test)
               for stmt in test.body for node in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            and (type_only or id(n) not in guarded)]


def import_graph(*, type_only: bool = False) -> dict[str, set[str]]:
    """Module → the package modules it imports (``from pkg import submodule`` is an edge to the submodule).

    ``type_only=True`` adds the imports under ``if TYPE_CHECKING:``.
    """
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")), type_only=type_only):
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


def _in(module: str, layer: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in layer)


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_not_even_a_type_only_import_closes_a_cycle() -> None:
    """``if TYPE_CHECKING:`` imports count: the seams' types (``typing``) name no implementation."""
    assert cycles(import_graph(type_only=True)) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """errors/signals/typing import nothing; ladder/ only them; config only those; and so on up to glue/,
    which imports no feature folder."""
    graph = import_graph(type_only=True)
    offenders = []
    allowed: tuple[str, ...] = ()
    for name, layer in LAYERS:
        allowed += layer
        for module, deps in graph.items():
            if _in(module, layer):
                offenders += [f"{name}: {module} -> {dep}" for dep in sorted(deps) if not _in(dep, allowed)]
    assert offenders == []


def test_below_the_glue_nothing_imports_the_glue() -> None:
    graph = import_graph(type_only=True)
    below = GROUND + LADDER + SETTINGS + POLICIES + EDGE + SCHEDULING
    assert sorted(f"{m} -> {d}" for m, deps in graph.items() if _in(m, below) for d in deps if _in(d, GLUE)) == []


def test_the_glue_names_its_extensions_without_importing_them() -> None:
    """Every built-in extension lives above the glue, and the glue's only link to it is its name."""
    from celery_delayq.glue.extensions import EXTENSIONS

    modules = {path.split(":")[0] for path in EXTENSIONS.values()}
    graph = import_graph(type_only=True)
    assert all(m in graph for m in modules)
    above = {m for m in modules if not _in(m, GLUE)}
    assert above, "the features come in as extensions"
    assert sorted(f"{m} -> {d}" for m, deps in graph.items() if _in(m, GLUE) for d in deps if d in above) == []


def _package(module: str) -> str:
    """The top-level package (or root module) of ``module``; the command lines count as ``cli``."""
    return "cli" if _in(module, CLI) else (module.split(".") + ["__init__"])[1]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder → the folders it imports (the root's modules each count as one)."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        out.setdefault(_package(module), set()).update(_package(d) for d in deps if _package(d) != _package(module))
    return out


def _knot_imports(graph: dict[str, set[str]], knot: list[str]) -> list[str]:
    """The module imports that tie the sub-packages of ``knot`` together."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if _package(m) in knot and _package(d) in knot and _package(m) != _package(d))


def test_the_features_form_floors() -> None:
    """No loop between sub-packages: no two features import each other (telemetry must not read the
    analytics, which read telemetry), save the knots listed in :data:`KNOWN_FEATURE_KNOTS`.
    Type-only imports count; a failure names the imports that tie each knot."""
    graph = import_graph(type_only=True)
    knots = [k for k in cycles(package_graph(graph)) if k not in KNOWN_FEATURE_KNOTS]
    assert knots == [], "sub-packages that import each other in a loop:\n" + "\n".join(
        f"  {' <-> '.join(k)}:\n    " + "\n    ".join(_knot_imports(graph, k)) for k in knots)


def test_the_feature_test_sees_two_features_that_import_each_other() -> None:
    graph = {"celery_delayq.telemetry.lasthour": {"celery_delayq.analytics.files"},
             "celery_delayq.analytics.files": set(), "celery_delayq.analytics.schema": {"celery_delayq.telemetry.x"},
             "celery_delayq.telemetry.x": set()}
    assert cycles(package_graph(graph)) == [["analytics", "telemetry"]]


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of the import graph: ``[a, b, c]`` when ``a`` imports ``b``, which imports ``c``.

    On a graph with a cycle (which :func:`test_the_package_has_no_import_cycle` refuses) the path ends
    where it meets a module again, named twice.
    """
    memo: dict[str, list[str]] = {}

    def longest(module: str) -> list[str]:
        if module not in memo:
            memo[module] = [module]  # a cycle stops here
            memo[module] = max(([module] + longest(d) for d in sorted(graph.get(module, ()))), key=len,
                               default=[module])
        return memo[module]

    return max((longest(m) for m in sorted(graph)), key=len, default=[])


def _chain_failure(chain: list[str], cap: int) -> str:
    return f"{len(chain)} modules import each other in a line (at most {cap}):\n    " + "\n -> ".join(chain)


def test_the_longest_import_chain_is_short() -> None:
    """Runtime imports (function-level ones too: a deferred import still runs) chain at most
    :data:`MAX_CHAIN` modules; a longer chain is printed, module by module."""
    chain = longest_chain(import_graph())
    assert len(chain) <= MAX_CHAIN, _chain_failure(chain, MAX_CHAIN)


def test_below_the_web_page_the_import_chain_is_shorter() -> None:
    """Leaving out the top floors (:data:`TOP`), at most :data:`MAX_CHAIN_BELOW_WEB` modules."""
    graph = {m: {d for d in deps if not _in(d, TOP)} for m, deps in import_graph().items() if not _in(m, TOP)}
    chain = longest_chain(graph)
    assert len(chain) <= MAX_CHAIN_BELOW_WEB, _chain_failure(chain, MAX_CHAIN_BELOW_WEB)


def test_the_chain_test_finds_the_longest_line_of_imports() -> None:
    graph = {"a": {"b", "x"}, "b": {"c"}, "c": {"d"}, "d": set(), "x": {"d"}}
    assert longest_chain(graph) == ["a", "b", "c", "d"]
    assert longest_chain({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # a cycle ends the path, never loops
    assert "\n -> b" in _chain_failure(["a", "b"], 1)


def test_nothing_imports_the_cli() -> None:
    """The CLI is the top floor: what it shares with others (status, app context, time words) lives below it."""
    graph = import_graph(type_only=True)
    assert sorted(f"{m} -> {d}" for m, deps in graph.items() if not _in(m, CLI) for d in deps if _in(d, CLI)) == []
    # Nor by name (importlib), which the graph cannot see: ``python -m celery_delayq.analytics`` runs its own command.
    assert [_module_name(p) for p in PACKAGE.rglob("*.py") if not _in(_module_name(p), CLI)
            and "import_module(\"celery_delayq.cli" in p.read_text(encoding="utf-8")] == []


def broker_client_importers(paths: list[Path]) -> list[Path]:
    """The files among ``paths`` that import py-amqp (``amqp``), type-only imports included."""
    return sorted(p for p in paths
                  if any((n.module or "").split(".")[0] == "amqp" if isinstance(n, ast.ImportFrom)
                         else any(a.name.split(".")[0] == "amqp" for a in n.names)
                         for n in _imports(ast.parse(p.read_text(encoding="utf-8")), type_only=True)))


def test_only_the_rabbitmq_edge_imports_the_broker_client() -> None:
    """One door to the broker: every AMQP call is made under ``celery_delayq.rabbitmq`` (issue #32: 16 modules in 6
    folders imported ``amqp`` at 287afbb)."""
    outside = [p for p in PACKAGE.rglob("*.py") if not _in(_module_name(p), ("celery_delayq.rabbitmq",))]
    assert [_module_name(p) for p in broker_client_importers(outside)] == []


def test_the_broker_client_check_sees_an_import(tmp_path: Path) -> None:
    lines = ("import amqp", "from amqp.exceptions import NotFound", "if TYPE_CHECKING:\n    import amqp")
    for i, line in enumerate(lines):
        (tmp_path / f"m{i}.py").write_text(f"from typing import TYPE_CHECKING\n{line}\n")
    (tmp_path / "clean.py").write_text("import kombu\n")
    assert [p.name for p in broker_client_importers(sorted(tmp_path.glob("*.py")))] == ["m0.py", "m1.py", "m2.py"]


def test_the_layer_test_sees_a_module_that_imports_upwards() -> None:
    graph = {"celery_delayq.ladder.spec": {"celery_delayq.rabbitmq.topology"}, "celery_delayq.rabbitmq.topology": set()}
    assert [d for m, deps in graph.items() if _in(m, LADDER) for d in deps if not _in(d, GROUND + LADDER)] \
        == ["celery_delayq.rabbitmq.topology"]
    glue = {"celery_delayq.glue.task": {"celery_delayq.parking.park"}}
    allowed = tuple(m for _, layer in LAYERS for m in layer)
    assert [d for deps in glue.values() for d in deps if not _in(d, allowed)] == ["celery_delayq.parking.park"]


def test_the_producer_hook_depends_only_on_its_protocols() -> None:
    """The producer asks a typed Protocol whether a publish is delayed; it imports no ladder code."""
    assert import_graph()["celery_delayq.glue.producer"] <= {"celery_delayq.typing",
                                                              "celery_delayq.ladder.plugin_compat"}


def picture(graph: dict[str, set[str]], type_only: dict[str, set[str]]) -> dict[str, object]:
    """The numbers of the import picture: root modules, floors, imports running back up, cycles."""
    import functools

    @functools.lru_cache(maxsize=None)
    def floor(module: str) -> int:
        return 1 + max((floor(d) for d in graph[module]), default=0)

    order = [m for _, layer in LAYERS for m in layer]

    def rank(module: str) -> int:
        if _in(module, CLI):
            return len(order) + 1
        return next((i for i, name in enumerate(order) if _in(module, (name,))), len(order))

    folders = {m.split(".")[1] for m in graph if m.count(".") >= 2}
    back = sorted(f"{m} -> {d}" for m, deps in type_only.items() for d in deps if rank(d) > rank(m))
    return {"modules": len(graph), "root modules": sorted(m for m in graph if m.count(".") <= 1
                                                           and m.split(".")[-1] not in folders),
            "floors": max(floor(m) for m in graph), "imports running back up": back,
            "cycles": cycles(graph), "type-only cycles": cycles(type_only),
            "longest chain": " -> ".join(longest_chain(graph)),
            "package knots": cycles(package_graph(type_only))}


if __name__ == "__main__":  # python tests/test_import_graph.py: the picture, for a review
    import pprint

    pprint.pprint(picture(import_graph(), import_graph(type_only=True)), width=110)
