"""What typer's help imports and a command never uses, loaded only if it is used.

``typer.rich_utils`` (imported to print any ``--help`` or usage error) imports
``rich.markdown`` (with ``markdown_it``) for the ``markdown`` markup mode, which aigcq does
not use, and ``rich.traceback`` (with ``rich.pretty``) for an uncaught exception's
traceback: together about half of ``aigcq --help``'s CPU. :func:`apply` puts a stand-in
module under each name, whose names typer imports are :class:`Deferred` classes (the real
module is imported the first time one is called or read); any other name of the module imports
the real one at once. Nothing else changes: the real modules behave as before once loaded.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

#: module -> the names typer.rich_utils imports from it
DEFERRED = {"rich.markdown": ("Markdown",), "rich.traceback": ("Traceback",)}


def _real(module: str) -> types.ModuleType:
    """The real ``module``, imported now in the stand-in's place (once)."""
    found = sys.modules.get(module)
    if isinstance(found, _StandIn):
        del sys.modules[module]
        found = importlib.import_module(module)
    assert found is not None
    return found


class Deferred(type):
    """The class of a name of a module not imported yet: calling it, or reading any
    attribute of it (``Traceback.from_exception``), imports the module and acts on the real
    name. A class, so that an annotation typer evaluates (``Markdown | Text``) still works."""

    _module: str
    _name: str

    def _target(cls) -> Any:
        return getattr(_real(cls._module), cls._name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._target()(*args, **kwargs)

    def __getattr__(cls, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(cls._target(), attribute)


def deferred(module: str, name: str) -> Deferred:
    """A stand-in for ``module.name``."""
    return Deferred(name, (), {"_module": module, "_name": name})


class _StandIn(types.ModuleType):
    """A module's place in ``sys.modules`` until it is needed: any name but the deferred
    ones imports the real module."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_real(self.__name__), name)


def apply() -> None:
    """Stand-ins for :data:`DEFERRED`, unless a module is imported already."""
    for module, names in DEFERRED.items():
        if module in sys.modules:
            continue
        stand_in = _StandIn(module)
        for name in names:
            setattr(stand_in, name, deferred(module, name))
        sys.modules[module] = stand_in
        parent, _, child = module.rpartition(".")
        setattr(importlib.import_module(parent), child, stand_in)  # ``rich.markdown.X``
