"""How ``--help`` names values: TEXT, INTEGER, PATH as click does, not typer's ``<str>``,
``<int>``; flags show no value (not ``<bool>``); a required argument reads ``PLATFORM``
in the usage line, not ``{platform}``. Applied once, when the CLI is imported."""

from __future__ import annotations

from typing import Any

from typer import core

_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "Path": "PATH", "list[str]": "TEXT"}
_typer_display_type = core._TyperParameter.display_type


def _display_type(self: core._TyperParameter, ctx: Any) -> str:
    if getattr(self, "is_flag", False):
        return ""
    label = _typer_display_type(self, ctx).removeprefix("<").removesuffix(">")
    return _NAMES.get(label, f"[{label}]")


def _usage_display_name(self: core.TyperArgument) -> str:
    name = self.display_name_raw.upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def apply() -> None:
    core._TyperParameter.display_type = _display_type  # type: ignore[method-assign]
    core.TyperArgument._usage_display_name = _usage_display_name  # type: ignore[method-assign]
