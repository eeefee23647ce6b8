"""Issue 38: one repository, several distributions, one version. Each has its README, none
ships ``aigcq/__init__.py`` (``aigcq`` is a namespace package they share), no regular
package is in two of them, and each imports only what it declares: the standard library,
its declared third-party dependencies (extras included) and the workspace distributions it
depends on (the last is :mod:`tests.unit.test_import_graph`'s)."""

from __future__ import annotations

import ast
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.fakes.distributions import DISTRIBUTIONS, ROOT, third_party


def test_the_distributions_are_the_six_of_the_issue() -> None:
    assert set(DISTRIBUTIONS) == {
        "aigcq", "aigcq-wire", "aigcq-bridge", "aigcq-client", "aigcq-asynch", "aigcq-emulators"
    }  # fmt: skip


def test_one_version_and_siblings_pinned_to_it() -> None:
    version = DISTRIBUTIONS["aigcq"].project["version"]
    project = DISTRIBUTIONS["aigcq"].project
    extras = project["optional-dependencies"]  # type: ignore[index]
    for dist in DISTRIBUTIONS.values():
        assert dist.project["version"] == version, dist.name
        reqs = [*dist.requirements]
        if dist.name == "aigcq":
            reqs += [Requirement(r) for extra in extras.values() for r in extra]  # type: ignore[attr-defined]
        for req in reqs:
            if canonicalize_name(req.name) in DISTRIBUTIONS:
                assert str(req.specifier) == f"=={version}", (dist.name, str(req))


def test_the_server_brings_every_other_distribution() -> None:
    """``pip install -e '.[embedded]'`` or ``'.[dev]'`` installs all of them."""
    project = DISTRIBUTIONS["aigcq"].project
    extras = project["optional-dependencies"]  # type: ignore[index]
    runtime = {canonicalize_name(r.name) for r in DISTRIBUTIONS["aigcq"].requirements}
    for extra in ("embedded", "dev"):
        named = {canonicalize_name(Requirement(r).name) for r in extras[extra]}
        assert runtime | named >= set(DISTRIBUTIONS) - {"aigcq"}, extra
    listed = (ROOT / "workspace.txt").read_text().split()
    assert {Path(p).name for p in listed if p.startswith("packages/")} == set(DISTRIBUTIONS) - {
        "aigcq"
    }


def test_each_has_a_readme_saying_how_to_install_it_alone() -> None:
    for dist in DISTRIBUTIONS.values():
        readme = (dist.home / "README.md").read_text()
        assert dist.project["readme"] == "README.md"
        if dist.name != "aigcq":
            assert readme.startswith(f"# {dist.name}\n"), dist.name
            assert "pip install" in readme and f"packages/{dist.name}" in readme, dist.name


def test_aigcq_is_a_namespace_and_no_package_is_in_two_distributions() -> None:
    owner: dict[Path, str] = {}
    for dist in DISTRIBUTIONS.values():
        assert not (dist.root / "aigcq" / "__init__.py").exists(), dist.name
        for init in (dist.root / "aigcq").rglob("__init__.py"):
            package = init.parent.relative_to(dist.root)
            assert package not in owner, (package, owner.get(package), dist.name)
            owner[package] = dist.name
    # a namespace portion holds modules, not packages of the same name elsewhere
    for dist in DISTRIBUTIONS.values():
        for folder in (dist.root / "aigcq").iterdir():
            if folder.is_dir() and not (folder / "__init__.py").exists():
                assert folder.relative_to(dist.root) not in owner, folder


def _guarded(tree: ast.AST) -> set[int]:
    """The ids of import nodes inside ``try: ... except ImportError``: optional imports."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            names = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if names & {"ImportError", "ModuleNotFoundError"}:
                found |= {id(n) for s in node.body for n in ast.walk(s)}
    return found


def top_level_imports(path: Path) -> set[str]:
    """The top-level names a module imports (absolute imports, optional ones excepted)."""
    tree = ast.parse(path.read_text())
    optional = _guarded(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def declared(name: str) -> set[str]:
    """The third-party distributions ``name`` may import: its dependencies' closure and
    those of its extras."""
    out = third_party(name)
    extras = DISTRIBUTIONS[name].project.get("optional-dependencies", {})
    out |= {canonicalize_name(Requirement(r).name) for rs in extras.values() for r in rs}  # type: ignore[attr-defined]
    return out


def test_each_imports_only_what_it_declares() -> None:
    providers = metadata.packages_distributions()
    undeclared = []
    for dist in DISTRIBUTIONS.values():
        allowed = declared(dist.name)
        for path in (dist.root / "aigcq").rglob("*.py"):
            for top in top_level_imports(path) - set(sys.stdlib_module_names) - {"aigcq"}:
                brought = {canonicalize_name(d) for d in providers.get(top, [])}
                if not brought & allowed:
                    undeclared.append(f"{path.relative_to(ROOT)}: {top}")
    assert undeclared == []


def test_an_undeclared_import_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import redis\ntry:\n    import psycopg\nexcept ImportError:\n    pass\n")
    assert top_level_imports(module) == {"redis"}


def test_a_command_of_a_distribution_not_installed_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``aigcq asynch`` where aigcq-asynch is not installed (the server alone)."""
    from typer.testing import CliRunner

    from aigcq.cli import command_table

    monkeypatch.setitem(command_table.LAZY, "asynch", ("aigcq.not_installed.cli", "app", True))
    app = command_table.root()
    command_table.register(app, "asynch")
    done = CliRunner().invoke(app, ["asynch"])
    assert done.exit_code == 2
    assert "pip install aigcq-asynch" in done.output
