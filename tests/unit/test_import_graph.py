"""The package's import graph has no circles: lower layers never import what assembles them.

Every import counts, including those under ``TYPE_CHECKING`` and inside functions: a circle
hidden behind a lazy import is still a circle for the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import aigcq

PACKAGE_DIR = Path(aigcq.__file__).parent


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    names: dict[str, Path] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = ["aigcq", *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
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


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {
        name: imported(ast.parse(path.read_text()), modules) - {name}
        for name, path in modules.items()
    }


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


def test_the_package_has_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_no_loose_modules_but_the_core() -> None:
    """Beside the packages, only what a reader looks for first lies at the top."""
    loose = {p.stem for p in PACKAGE_DIR.glob("*.py")}
    assert loose == {"__init__", "__main__", "config", "domain", "health"}
