"""Run ``python -m aigcq.asynch serve`` as real worker processes for the tests and the bench."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_asynch(
    database_url: str,
    redis_url: str,
    data_dir: Path,
    *,
    log: Path,
    args: Sequence[str] = ("serve", "--log-level", "WARNING"),
    **env: str,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start one asynch process (worker loop on) and wait until it answers; ``(proc, url)``.

    ``args`` follow ``python -m aigcq.asynch``; none at all means serve."""
    port = free_port()
    environ = {
        **os.environ,
        "AIGCQ_DATABASE_URL": database_url,
        "AIGCQ_REDIS_URL": redis_url,
        "AIGCQ_DATA_DIR": str(data_dir),
        "AIGCQ_ASYNCH_PORT": str(port),
        "AIGCQ_ASYNCH_WORKER_ENABLED": "true",
        **env,
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aigcq.asynch", *args],
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, log)
    return proc, url


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 30) -> None:
    """Wait until ``url/health`` answers 200; kill ``proc`` and fail if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"asynch process did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
