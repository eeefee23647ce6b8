"""Which aigcq process owns a private server's data directory.

The owner holds an exclusive ``flock`` on ``owner.lock`` there for as long as it runs the server;
the kernel drops the lock when the owner dies, however it dies. The private servers run in their
own session, so a SIGKILLed aigcq leaves its server behind: starting a second one on the same
files would fail (PostgreSQL's lock file) or, worse, succeed (two Redis servers appending to one
file). So a new owner first stops whatever the server's pid file names, provided it is still
that program; a directory whose owner is alive is refused instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

log = logging.getLogger(__name__)


class EmbeddedServerError(RuntimeError):
    """A private server could not be started; the message says why and what to do."""


class DirectoryInUse(EmbeddedServerError):
    pass


class OwnerLock:
    """The exclusive claim of this process on ``data_dir`` (``acquire`` / ``release``)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "owner.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Claim the directory (created if need be), or raise :class:`DirectoryInUse` naming
        the live owner."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DirectoryInUse(
                f"{self.path.parent} is in use by another aigcq process (pid {owner}); "
                "stop that one, or give this one another AIGCQ_DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def start_owned(self, start: Callable[[], str]) -> str:
        """Claim the directory and run ``start``; a start that fails gives the claim back."""
        self.acquire()
        try:
            return start()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None


class PrivateServer(ABC):
    """A server of this process's own on the files in ``data_dir``: :meth:`start` claims the
    directory (:class:`OwnerLock`) for as long as the server runs."""

    #: seconds :meth:`start` waits for the server by default
    start_timeout: ClassVar[float]

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self._owner = OwnerLock(self.data_dir)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    @abstractmethod
    def url(self) -> str:
        """Where its clients connect."""

    def start(self, timeout: float | None = None) -> str:
        """Start the server (stopping one a dead aigcq left behind here) within ``timeout``
        seconds (default :attr:`start_timeout`); its URL."""
        wait = self.start_timeout if timeout is None else timeout
        return self._owner.start_owned(lambda: self._start(wait))

    @abstractmethod
    def _start(self, timeout: float) -> str:
        """:meth:`start` once the directory is claimed."""

    def _stopped(self) -> None:
        """The server is gone: forget its process and give the claim back."""
        self._proc = None
        self._owner.release()


def stop_leftover(pid_file: Path, program: str, stop_signal: int, timeout: float = 15.0) -> None:
    """Stop the ``program`` whose pid is the first line of ``pid_file``, if it still runs:
    ``stop_signal`` first (a clean shutdown), SIGKILL after ``timeout`` seconds."""
    pid = _pid_of(pid_file, program)
    if pid is None:
        return
    log.warning(
        "stopping the %s left running by an earlier aigcq (pid %s, %s)", program, pid, pid_file
    )
    _signal(pid, stop_signal)
    if not _wait_gone(pid, timeout):
        log.warning("%s pid %s ignored signal %s; killing it", program, pid, stop_signal)
        _signal(pid, signal.SIGKILL)
        _wait_gone(pid, timeout)


def _pid_of(pid_file: Path, program: str) -> int | None:
    """The live pid named by ``pid_file`` when that process runs ``program``, else None."""
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0].strip())
        # Redis rewrites its title to "<path> <address>" in place of its arguments
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].split(b" ", 1)[0]
    except (OSError, ValueError):
        return None
    return pid if Path(os.fsdecode(argv0)).name.startswith(program) else None


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and not _is_zombie(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
