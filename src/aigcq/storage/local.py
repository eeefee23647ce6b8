"""A local folder whose files are served over HTTP by the application that owns it."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path

from aigcq.storage.base import Storage, StorageError, check_name

log = logging.getLogger(__name__)


class SlowWrites:
    """Says when writes have become slow: most of the last ``window`` took longer than
    ``threshold`` seconds (then it starts again). A write stretched now and then by the
    scheduler, however long, does not count; a disk that stays slow does, within a few
    writes."""

    def __init__(self, threshold: float, window: int = 9) -> None:
        self.threshold = threshold
        self.window = window
        self._recent: deque[bool] = deque(maxlen=window)  # slow or not, newest last

    def observe(self, seconds: float) -> bool:
        self._recent.append(seconds > self.threshold)
        if sum(self._recent) * 2 > self.window:
            self._recent.clear()
            return True
        return False


class LocalStorage(Storage):
    """Writes files under ``root``; their URL is ``{public_url}/{name}``.

    A file is written in place: its URL is handed out only once :meth:`put` returns, so
    no reader can see it half-written (a temporary name and a rename cost 2.5 times as
    much here).

    Small files (up to ``inline_max_bytes``) are written on the event loop: into the page
    cache that takes 25–40 µs, while handing it to a thread costs about 200 µs of CPU in
    thread switches. A disk that is slow to create files would delay every other request
    by as much, so once most recent inline writes take longer than ``slow_write_seconds``
    (see :class:`SlowWrites`) all writes go to a thread for ``offload_seconds``; larger
    files always do.
    """

    def __init__(
        self,
        root: Path,
        public_url: str,
        *,
        inline_max_bytes: int = 64 * 1024,
        slow_write_seconds: float = 0.0005,
        offload_seconds: float = 10.0,
    ) -> None:
        self.root = root.resolve()
        self.public_url = public_url.rstrip("/")
        self.inline_max_bytes = inline_max_bytes
        self.offload_seconds = offload_seconds
        self._offload_until = 0.0  # monotonic time until which every write goes to a thread
        self._slow = SlowWrites(slow_write_seconds)
        self._dirs: set[Path] = set()  # folders known to exist

    def path_of(self, name: str) -> Path:
        return self.root / check_name(name)

    @property
    def offloading(self) -> bool:
        """Whether writes currently go to a thread because inline writes were slow."""
        return time.monotonic() < self._offload_until

    async def _put(
        self, name: str, data: bytes, content_type: str, headers: Mapping[str, str]
    ) -> str:
        path = self.root / name
        if len(data) > self.inline_max_bytes or self.offloading:
            await asyncio.to_thread(self._write, path, data)
        else:
            self._write_inline(name, path, data)
        return f"{self.public_url}/{name}"

    def owns(self, url: str) -> bool:
        return url.startswith(self.public_url + "/")

    async def remove_urls(self, urls: Iterable[str]) -> int:
        """Delete the files behind ``urls`` that this storage handed out; others (another
        backend's, or already gone) are skipped. Returns how many were deleted."""
        prefix = self.public_url + "/"
        names = [u[len(prefix) :] for u in urls if u.startswith(prefix)]
        return await asyncio.to_thread(self._remove, names) if names else 0

    def _remove(self, names: list[str]) -> int:
        removed = 0
        for name in names:
            try:
                self.path_of(name).unlink()
                removed += 1
            except (FileNotFoundError, StorageError):
                continue
            except OSError as exc:
                log.warning("could not delete %s: %s", name, exc)
        return removed

    async def remove_older(self, folder: str, before: float) -> int:
        """Delete the files under ``folder`` last written before ``before`` (epoch s), and
        the folders that leaves empty; how many files went."""
        return await asyncio.to_thread(self._remove_older, self.path_of(folder), before)

    def _remove_older(self, top: Path, before: float) -> int:
        removed = 0
        for path in sorted(top.rglob("*"), reverse=True):  # a folder after its files
            try:
                if path.is_dir():
                    path.rmdir()  # only once empty
                    self._dirs.discard(path)
                elif path.stat().st_mtime < before:
                    path.unlink()
                    removed += 1
            except OSError:  # not empty, or gone meanwhile
                continue
        return removed

    def _write_inline(self, name: str, path: Path, data: bytes) -> None:
        started = time.monotonic()
        self._write(path, data)
        took = time.monotonic() - started
        if self._slow.observe(took):
            log.warning(
                "writing %s: files took over %.1f ms each lately; they go to a thread for %.0f s",
                name,
                self._slow.threshold * 1000,
                self.offload_seconds,
            )
            self._offload_until = started + took + self.offload_seconds

    def _write(self, path: Path, data: bytes) -> None:
        if path.parent not in self._dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
