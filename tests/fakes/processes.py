"""Real ``aigcq`` processes for the e2e tests: ``Cluster`` (servers, bridges, emulators;
in ``bench/processes.py``, shared with the benches), ``start_dispatcher`` message-dispatchers
and ``start_asynch`` model-asynch workers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from bench.processes import (
    ADMIN_TOKEN,
    ASYNCH_ADMIN_TOKEN,
    BRIDGE_TOKEN,
    SECRET,
    Cluster,
    Ports,
    Proc,
    reserved_port,
    wait_http,
)

from tests.fakes.waiting import wait_until_sync

__all__ = [
    "ADMIN_TOKEN",
    "ASYNCH_ADMIN_TOKEN",
    "BRIDGE_TOKEN",
    "MD_PASSWORD",
    "SECRET",
    "Cluster",
    "Ports",
    "Proc",
    "reserved_port",
    "start_asynch",
    "start_dispatcher",
    "stop",
    "wait_free",
    "wait_healthy",
    "wait_http",
]

MD_PASSWORD = "e2e-md-password"


def start_dispatcher(c: Cluster, port: int | None = None, **extra: str) -> tuple[Proc, int]:
    port = port or c.ports.take()
    env = {
        "AIGCQ_REDIS_URL": c.redis_url,
        "AIGCQ_MD_PORT": str(port),
        "AIGCQ_DATA_DIR": str(c.tmp / f"md-{port}"),
        "AIGCQ_BRIDGE_TOKEN": BRIDGE_TOKEN,
        "AIGCQ_TOKEN_SECRET": SECRET,
        "AIGCQ_MD_JWT_SECRET": SECRET,
        "MD_PASSWORD": MD_PASSWORD,
        "AIGCQ_HEALTH_INTERVAL_S": "0.2",
        "AIGCQ_SWEEP_INTERVAL_S": "0.2",
        **extra,
    }
    proc = Proc(["dispatcher"], env, c.tmp / f"md-{port}.log").start()
    c.procs.append(proc)
    wait_http(f"http://127.0.0.1:{port}/api/health")
    return proc, port


def wait_free(md_port: int, free: int = 1, timeout: float = 20.0) -> None:
    """Until the dispatcher on ``md_port`` is healthy with ``free`` free slots or more."""
    seen: list[Any] = []

    def ready() -> bool:
        seen[:] = [httpx.get(f"http://127.0.0.1:{md_port}/api/health").json()["data"]]
        return bool(seen[0]["healthy"] and seen[0]["freeSlots"] >= free)

    wait_until_sync(ready, timeout, what=lambda: f"the dispatcher with {free} free: {seen}")


def start_asynch(
    database_url: str,
    redis_url: str,
    data_dir: Path,
    *,
    log: Path,
    args: Sequence[str] = ("serve", "--log-level", "WARNING"),
    port: int | None = None,
    **env: str,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start one asynch process (worker loop on) and wait until it answers; ``(proc, url)``.

    ``args`` follow ``python -m aigcq.asynch``; none at all means serve."""
    port = port or reserved_port()
    environ = {
        **os.environ,
        "AIGCQ_DATABASE_URL": database_url,
        "AIGCQ_REDIS_URL": redis_url,
        "AIGCQ_DATA_DIR": str(data_dir),
        "AIGCQ_ASYNCH_PORT": str(port),
        "AIGCQ_ASYNCH_WORKER_ENABLED": "true",
        "AIGCQ_ASYNCH_ADMIN_TOKEN": ASYNCH_ADMIN_TOKEN,
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

    def healthy() -> bool:
        if proc.poll() is not None:
            raise ProcessLookupError(f"exited with {proc.returncode}")  # stop waiting
        return httpx.get(f"{url}/health", timeout=1).status_code == 200

    try:
        wait_until_sync(healthy, timeout, 0.1, ignore=(httpx.HTTPError,), what=f"{url}/health")
    except (AssertionError, ProcessLookupError):
        proc.kill()
        raise RuntimeError(f"asynch process did not start: {log.read_text()[-2000:]}") from None


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
