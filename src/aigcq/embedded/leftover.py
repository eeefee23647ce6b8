"""Stop a private server that an earlier aigcq process left running on the same data directory.

The private servers run in their own session, so a SIGKILLed aigcq leaves them behind. Starting a
second one on the same files would fail (PostgreSQL's lock file) or, worse, succeed (two Redis
servers appending to one file), so start-up first stops whatever the pid file names, provided it
is still that program.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


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
