"""Uploaded inputs in an API-format graph: Comfy API v2's ``core/ASSET`` references.

A node input that names a file uploaded to aigcq is ``{"__type": "core/ASSET", "info":
{"id", "hash": "blake3:<hex>", "file_path"}}``. The gateway checks and completes each one at
submit, a paid target that cannot take them says so, and the bridge that runs the job makes
each one a file of its ComfyUI instance: all three walk a graph the same way, here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

ASSET_TYPE = "core/ASSET"
_DIGEST = re.compile(r"blake3:([0-9a-f]{64})")


def digest_hex(value: Any) -> str | None:
    """The hex of a ``blake3:<hex>`` digest (any case), else None."""
    if not isinstance(value, str):
        return None
    found = _DIGEST.fullmatch(value.lower())
    return found.group(1) if found else None


def is_asset_ref(value: Any) -> bool:
    return isinstance(value, dict) and value.get("__type") == ASSET_TYPE


def asset_refs(graph: Any) -> list[dict[str, Any]]:
    """Every ``core/ASSET`` reference of ``graph``, in document order."""
    found: list[dict[str, Any]] = []

    def visit(value: Any) -> None:
        if is_asset_ref(value):
            found.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)
        elif isinstance(value, list):
            for v in value:
                visit(v)

    visit(graph)
    return found


def has_assets(graph: Any) -> bool:
    """Whether ``graph`` holds a ``core/ASSET`` reference."""
    if is_asset_ref(graph):
        return True
    if isinstance(graph, dict):
        return any(has_assets(v) for v in graph.values())
    if isinstance(graph, list):
        return any(has_assets(v) for v in graph)
    return False


def replace_assets(graph: Any, replaced: Callable[[dict[str, Any]], Any]) -> Any:
    """A copy of ``graph`` with each ``core/ASSET`` reference ``ref`` made ``replaced(ref)``
    (the rest shared with ``graph``'s leaves)."""
    if is_asset_ref(graph):
        return replaced(graph)
    if isinstance(graph, dict):
        return {k: replace_assets(v, replaced) for k, v in graph.items()}
    if isinstance(graph, list):
        return [replace_assets(v, replaced) for v in graph]
    return graph
