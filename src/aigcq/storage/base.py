"""The storage interface every backend implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class StorageError(RuntimeError):
    """An upload failed; the message says where and why."""


class Storage(Protocol):
    """Stores one file and returns the URL it can be fetched from."""

    async def put(
        self,
        name: str,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Store ``data`` under ``name`` (a relative path such as ``asynch/abc.png``).

        ``headers`` are passed to backends that forward caller identity (the OSS service's
        ``Authorization`` / ``X-User-Info``); others ignore them.
        """
        ...


def check_name(name: str) -> str:
    """Refuse absolute names and ``..`` segments, so a name never escapes its root."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage name {name!r}")
    return name
