"""A local folder whose files are served over HTTP by the application that owns it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

from aigcq.storage.base import check_name

INLINE_WRITE_BYTES = 64 * 1024


class LocalStorage:
    """Writes files under ``root``; their URL is ``{public_url}/{name}``.

    Files are written to a temporary name and renamed, so a reader never sees half a file.
    """

    def __init__(self, root: Path, public_url: str) -> None:
        self.root = root.resolve()
        self.public_url = public_url.rstrip("/")

    def path_of(self, name: str) -> Path:
        return self.root / check_name(name)

    async def put(
        self,
        name: str,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        path = self.path_of(name)
        if len(data) <= INLINE_WRITE_BYTES:
            self._write(path, data)  # cheaper than a thread hop for small files
        else:
            await asyncio.to_thread(self._write, path, data)
        return f"{self.public_url}/{name}"

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
