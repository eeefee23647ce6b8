"""The ``dev`` extra runs the tests against what users install: no development tool, nor
anything it pulls in, caps a runtime dependency (cozepy's ``websockets < 15`` and
``httpx < 0.29`` once made the tests run websockets 14.2 where users got 17.x; cozepy now
has a venv of its own, ``scripts/vendor-venvs``)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def project() -> dict[str, list[str]]:
    """The server's runtime dependencies and its ``dev`` extra's development tools (the
    repository's other distributions, aigcq-asynch in the extra, are product, not tools)."""
    table = tomllib.loads(PYPROJECT.read_text())["project"]
    tools = [r for r in table["optional-dependencies"]["dev"] if not r.startswith("aigcq")]
    return {"runtime": table["dependencies"], "dev": tools}


def applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": extra}) for extra in extras or {""})


def upper_bounds(req: Requirement) -> list[str]:
    """The clauses of ``req`` that stop a newer release: ``<``, ``<=``, ``==``, ``~=``."""
    return [str(s) for s in req.specifier if s.operator in ("<", "<=", "==", "~=", "===")]


def caps_from(roots: list[str], runtime: set[str]) -> list[str]:
    """Every requirement, reached from ``roots`` through installed packages, that caps a
    package of ``runtime``; the walk stops at runtime packages (users get their pins too)."""
    found, seen = [], set()
    todo = [(Requirement(r), "dev extra") for r in roots]
    while todo:
        req, by = todo.pop()
        name = canonicalize_name(req.name)
        if name in runtime:
            found += [f"{by} requires {req}" for _ in upper_bounds(req)[:1]]
            continue
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            sub = Requirement(line)
            if applies(sub, set(req.extras)):
                todo.append((sub, f"{dist.metadata['Name']} {dist.version}"))
    return found


def runtime_names() -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in project()["runtime"]}


def test_no_dev_dependency_caps_a_runtime_dependency() -> None:
    assert caps_from(project()["dev"], runtime_names()) == []


def test_the_check_finds_a_cap() -> None:
    """What cozepy 0.20 did, as a made-up root: the check is not vacuous."""
    assert caps_from(["websockets<15"], runtime_names()) == ["dev extra requires websockets<15"]
