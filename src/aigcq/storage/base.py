"""The storage interface every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping


class StorageError(RuntimeError):
    """An upload failed; the message says where and why."""


class Storage(ABC):
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
        return await self._put(check_name(name), data, content_type, headers or {})

    def owns(self, url: str) -> bool:
        """Whether ``url`` is where this storage keeps a file (one :meth:`put` handed out)."""
        return False

    @abstractmethod
    async def _put(
        self, name: str, data: bytes, content_type: str, headers: Mapping[str, str]
    ) -> str:
        """:meth:`put` in this backend, ``name`` checked by :func:`check_name`."""


def check_name(name: str) -> str:
    """Refuse absolute names and ``..`` segments, so a name never escapes its root."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage name {name!r}")
    return name
