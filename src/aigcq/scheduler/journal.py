"""The local journal of accepted paid creates: a remote id a platform handed us (and bills)
is on disk before anything else is done with it.

A paid create's acceptance is written to Redis by :meth:`Lifecycle.accepted`, tried for as
long as Redis does not answer. A process that dies meanwhile (SIGKILL, a crash, a host
restart) would forget the remote id, and its task would fail ``UncertainSubmit`` although it
ran. So each acceptance is first appended to this process's journal file and fsynced; once
Redis has it, a ``done`` line follows (not fsynced: replaying an applied entry changes
nothing), and a file with nothing pending is emptied.

Each process writes a file of its own under ``<data_dir>/accepted/``, holding an exclusive
``flock`` on it for its life. A file nobody holds is a dead process's: whoever finds it
(this process at its start, and every :data:`SCAN_S` after) replays its pending entries
through :meth:`Lifecycle.accepted`, then deletes it. Several processes may share one data
dir: the lock decides who replays.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

#: seconds between two looks for journals of dead processes
SCAN_S = 10.0
SUFFIX = ".jsonl"
PREFIX = "accepted-"


@dataclass(frozen=True, slots=True)
class Entry:
    """One accepted paid create: what :meth:`Lifecycle.accepted` needs to record it."""

    task_id: str
    attempt: int
    backend_id: str
    remote_id: str
    aigc: str
    platform: str
    target: str
    kind: str

    @property
    def key(self) -> str:
        return f"{self.task_id}/{self.attempt}/{self.remote_id}"


class AcceptedJournal:
    """This process's journal file, and the finding of dead processes' ones."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._path: Path | None = None
        self._pending: set[str] = set()
        #: the first appends run in threads at once: one of them makes the file
        self._making = threading.Lock()

    async def append(self, entry: Entry) -> None:
        """On disk (fsynced) when this returns."""
        line = orjson.dumps({"add": asdict(entry)}) + b"\n"
        self._pending.add(entry.key)
        await asyncio.to_thread(self._write, line, True)

    def done(self, entry: Entry) -> None:
        """Redis has ``entry`` now; a file with nothing pending is emptied."""
        self._pending.discard(entry.key)
        if self._fd is None:
            return
        if self._pending:
            self._write(orjson.dumps({"done": entry.key}) + b"\n", False)
        else:
            os.ftruncate(self._fd, 0)

    def close(self) -> None:
        """At a clean stop: the file goes unless something in it is still pending (then
        the next process to find it replays it)."""
        if self._fd is None or self._path is None:
            return
        if not self._pending:
            self._path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def _write(self, line: bytes, sync: bool) -> None:
        fd = self._own()
        os.write(fd, line)
        if sync:
            os.fsync(fd)

    def _own(self) -> int:
        """This process's file, made (and locked) at its first entry: locked under a
        temporary name, then renamed, so no other process ever finds it unlocked."""
        if self._fd is not None:
            return self._fd
        with self._making:
            if self._fd is None:
                self._fd = self._made()
        return self._fd

    def _made(self) -> int:
        """A new journal file of this process, its lock held."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{PREFIX}{uuid.uuid4().hex}"
        temp = self.directory / f".{name}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._path = self.directory / f"{name}{SUFFIX}"
        os.rename(temp, self._path)
        _sync_dir(self.directory)
        return fd

    def dead(self) -> Iterator[tuple[Path, int, list[Entry]]]:
        """Journals no live process holds: (path, its locked fd, its pending entries).
        The caller replays the entries, then :func:`forget` s the file."""
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}")):
            if path == self._path:
                continue
            fd = _lock(path)
            if fd is not None:
                yield path, fd, _pending(path)


def forget(path: Path, fd: int) -> None:
    """A dead process's journal, replayed: deleted, then unlocked."""
    path.unlink(missing_ok=True)
    _sync_dir(path.parent)
    os.close(fd)


def _lock(path: Path) -> int | None:
    """An fd holding ``path``'s lock; None while a live process holds it, or once a
    replay by another process deleted it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if os.fstat(fd).st_nlink == 0:  # replayed and deleted while we waited for it
        os.close(fd)
        return None
    return fd


def _pending(path: Path) -> list[Entry]:
    """The entries of a journal without their ``done`` line; an unreadable line (a torn
    write at a crash: never fsynced, so never acted on) is skipped."""
    added: dict[str, Entry] = {}
    for raw in path.read_bytes().splitlines():
        try:
            line = orjson.loads(raw)
            if "add" in line:
                entry = Entry(**line["add"])
                added[entry.key] = entry
            else:
                added.pop(str(line["done"]), None)
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            log.warning("journal %s: skipping an unreadable line (%r)", path, exc)
    return list(added.values())


def _sync_dir(directory: Path) -> None:
    """A file's creation, renaming or removal is durable once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
