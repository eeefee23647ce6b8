"""The repository's distributions (the server at the root, the others under ``packages/``),
what each depends on, and an interpreter that sees one of them alone.

``alone(dist, tmp)`` gives the ``sys.path`` of a fresh install of ``dist``: the source roots
of the workspace distributions it depends on, and a folder that links only the third-party
packages its declared dependencies reach (from this venv, so no registry is asked). An
interpreter started with ``-I -S`` and that path cannot import anything else: an import of
redis by the SDK fails there as it would on a business backend that installed only the SDK.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Distribution:
    name: str
    #: its folder (pyproject.toml, README.md)
    home: Path

    @property
    def root(self) -> Path:
        """Its source root: the folder holding its portion of the ``aigcq`` package."""
        return self.home / "src"

    @property
    def project(self) -> dict[str, object]:
        table: dict[str, object] = tomllib.loads((self.home / "pyproject.toml").read_text())[
            "project"
        ]
        return table

    @property
    def requirements(self) -> list[Requirement]:
        return [Requirement(r) for r in self.project.get("dependencies", [])]  # type: ignore[attr-defined]


DISTRIBUTIONS: dict[str, Distribution] = {
    d.name: d
    for d in [
        Distribution("aigcq", ROOT),
        *(Distribution(p.name, p) for p in sorted((ROOT / "packages").iterdir()) if p.is_dir()),
    ]
}


def distribution_of(path: Path) -> str:
    """The distribution whose source holds ``path``."""
    path = path.resolve()
    found = [d.name for d in DISTRIBUTIONS.values() if path.is_relative_to(d.root)]
    assert len(found) == 1, (path, found)
    return found[0]


@cache
def depends_on(name: str) -> frozenset[str]:
    """``name`` and the workspace distributions it depends on, at any depth (runtime
    dependencies, not extras)."""
    out = {name}
    for req in DISTRIBUTIONS[name].requirements:
        other = canonicalize_name(req.name)
        if other in DISTRIBUTIONS and other not in out:
            out |= depends_on(other)
    return frozenset(out)


def _applies(req: Requirement, extras: frozenset[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": extra}) for extra in extras or {""})


def third_party(name: str) -> set[str]:
    """The third-party distributions (canonical names) a fresh ``pip install name`` brings:
    its declared dependencies and theirs, as installed here."""
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [req for dist in depends_on(name) for req in DISTRIBUTIONS[dist].requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key[0] in DISTRIBUTIONS or key in seen:
            continue
        seen.add(key)
        found.add(key[0])
        requires = metadata.distribution(req.name).requires or []
        todo += [r for r in map(Requirement, requires) if _applies(r, key[1])]
    return found


def _top_levels(name: str) -> set[str]:
    """The top-level names a distribution installed into site-packages (its packages,
    modules and metadata folder)."""
    files = metadata.distribution(name).files or []
    return {f.parts[0] for f in files if f.parts and f.parts[0] != ".." and f.suffix != ".pth"}


def alone(name: str, tmp: Path) -> list[str]:
    """The ``sys.path`` entries of a fresh install of the distribution ``name``."""
    site = tmp / f"site-{name}"
    site.mkdir()
    site_packages = Path(metadata.distribution("pydantic").locate_file(""))
    for dep in third_party(name):
        for top in _top_levels(dep):
            if not (site / top).exists() and (site_packages / top).exists():
                (site / top).symlink_to(site_packages / top)
    return [*(str(DISTRIBUTIONS[d].root) for d in sorted(depends_on(name))), str(site)]


def isolated(path: list[str], code: str) -> list[str]:
    """The command line of an interpreter that sees only ``path`` (and the standard library),
    then runs ``code``."""
    return [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {path!r}\n{code}"]
