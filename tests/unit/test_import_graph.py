"""The package's import graph has no circles, its packages keep their layers (a lower
layer never imports what assembles it), and each distribution of the repository imports
only the distributions it depends on (``packages/*/pyproject.toml``): the bridge and the SDK
only the wire.

Every import counts, including those under ``TYPE_CHECKING`` and inside functions: a circle
hidden behind a lazy import is still a circle for the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.fakes.distributions import DISTRIBUTIONS, depends_on, distribution_of

#: the server's own source (its loose modules live here)
PACKAGE_DIR = DISTRIBUTIONS["aigcq"].root / "aigcq"


def module_names() -> dict[str, Path]:
    """Every module of every distribution by dotted name (a package by its ``__init__``)."""
    names: dict[str, Path] = {}
    for dist in DISTRIBUTIONS.values():
        for path in (dist.root / "aigcq").rglob("*.py"):
            parts = ["aigcq", *path.relative_to(dist.root / "aigcq").with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            assert name not in names, f"{name}: in two distributions ({names.get(name)}, {path})"
            names[name] = path
    return names


def imported(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``tree`` imports (``from x import y``: ``x.y`` if a module)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module not in modules:
                continue
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found.update(subs & modules.keys() or {node.module})
    return found


def with_parents(name: str, targets: set[str], modules: dict[str, Path]) -> set[str]:
    """``targets`` plus the packages Python runs first to import them (``aigcq.cli`` for
    ``aigcq.cli.status``), except the importer's own packages, which are already running."""
    own = {name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)}
    out = set(targets)
    for target in targets:
        parts = target.split(".")
        out.update(".".join(parts[:i]) for i in range(2, len(parts)))
    return {m for m in out if m in modules and m not in own and m != "aigcq"}


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph = {}
    for name, path in modules.items():
        targets = imported(ast.parse(path.read_text()), modules) - {name}
        graph[name] = with_parents(name, targets, modules)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_a_package_init_counts_as_imported() -> None:
    modules = {m: Path() for m in ("aigcq.cli", "aigcq.cli.app", "aigcq.asynch.cli")}
    assert with_parents("aigcq.asynch.cli", {"aigcq.cli.app"}, modules) == {
        "aigcq.cli",
        "aigcq.cli.app",
    }
    assert with_parents("aigcq.cli.app", {"aigcq.cli.client"}, modules) == set()


def test_the_package_has_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_no_loose_modules_but_the_core() -> None:
    """Beside the packages, only what a reader looks for first lies at the top."""
    loose = {p.stem for p in PACKAGE_DIR.glob("*.py")}
    assert loose == {"__main__", "config", "domain", "health", "runtime"}


#: the package's layers, bottom first: a module imports its own layer's and lower ones'
#: (docs/architecture.md draws them)
LAYERS: list[set[str]] = [
    {"wire", "domain", "config", "plumbing", "observability"},
    {"queue", "platforms", "delivery", "storage", "embedded", "health", "client", "emulators"},
    {"runtime"},
    {"scheduler"},
    {"bridges", "mdclient"},
    {"gateway"},
    {"serve", "agent", "web"},
    {"dispatcher", "asynch"},
    {"cli", "__main__"},
]


def layer_of(module: str) -> int:
    """A package's layer; an entry point (``python -m aigcq.x``, a product's ``x.cli``) is
    the CLI's."""
    top = module.split(".")[1] if module.count(".") else ""
    if module.endswith((".__main__", ".cli")) and module.count(".") == 2:
        top = "cli"
    found = [i for i, layer in enumerate(LAYERS) if top in layer]
    assert found, f"{module}: its package is in no layer of LAYERS"
    return found[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher layer than the importer's."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name != "aigcq"
        for target in targets
        if layer_of(target) > layer_of(name)
    )


def test_upward_imports_are_found() -> None:
    graph = {"aigcq.queue.store": {"aigcq.scheduler.lifecycle"}, "aigcq.cli.app": {"aigcq.domain"}}
    assert upward_imports(graph) == ["aigcq.queue.store -> aigcq.scheduler.lifecycle"]


def test_no_package_imports_a_higher_layer() -> None:
    """Nothing below ``serve/`` or the CLI imports them; the runtime context sits low."""
    assert upward_imports(import_graph()) == []


def foreign_imports(graph: dict[str, set[str]], modules: dict[str, Path]) -> list[str]:
    """Every import of a module of a distribution the importer's does not depend on."""

    def named(module: str) -> str:
        return f"{module} ({distribution_of(modules[module])})"

    return sorted(
        f"{named(name)} -> {named(target)}"
        for name, targets in graph.items()
        for target in targets
        if distribution_of(modules[target]) not in depends_on(distribution_of(modules[name]))
    )


def test_a_distribution_imports_only_those_it_depends_on() -> None:
    """The bridge and the SDK import only the wire; the emulators too; the server all but
    model-asynch, which is built on the server (it depends on it)."""
    modules = module_names()
    assert foreign_imports(import_graph(), modules) == []
    assert depends_on("aigcq-bridge") == {"aigcq-bridge", "aigcq-wire"}
    assert depends_on("aigcq-client") == {"aigcq-client", "aigcq-wire"}


def test_foreign_imports_are_found() -> None:
    modules = module_names()
    graph = {"aigcq.agent.app": {"aigcq.queue.store"}}
    assert foreign_imports(graph, modules) == [
        "aigcq.agent.app (aigcq-bridge) -> aigcq.queue.store (aigcq)"
    ]
