"""Real ``aigcq`` processes for the e2e tests and the benches: ``Cluster`` starts servers,
bridges, dispatchers and emulators as ``python -m aigcq ...`` children of one test (each
listening on a port it is told, as in production), ``start_asynch`` model-asynch workers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.client import CLIENT_TOKEN
from tests.fakes.waiting import wait_until_sync

ADMIN_TOKEN = "e2e-admin-token"
SECRET = "e2e-secret-with-at-least-32-bytes-of-key"
BRIDGE_TOKEN = "e2e-bridge-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One ``python -m aigcq ...`` child process with its log in the test's tmp dir."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        out = self.log.open("ab")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "aigcq", *self.args],
            env={**os.environ, **self.env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        return self

    def kill(self) -> None:
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()

    def stop(self) -> None:
        if self.p and self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_http(url: str, timeout: float = 20.0) -> None:
    """Until ``url`` answers with a status below 500 (its process is up)."""
    wait_until_sync(
        lambda: httpx.get(url, timeout=1.0).status_code < 500,
        timeout,
        0.1,
        ignore=(httpx.HTTPError,),
        what=f"{url} to come up",
    )


class Cluster:
    """Starts and kills the processes of one test; everything on 127.0.0.1."""

    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.tmp = tmp
        self.redis_url = redis_url
        self.procs: list[Proc] = []
        self.config_dir = tmp / "config"
        self.config_dir.mkdir()

    def write_models(self, models: dict[str, Any]) -> None:
        (self.config_dir / "model.json").write_text(json.dumps(models))

    def emulator(self, kind: str, *args: str) -> str:
        port = free_port()
        if kind == "comfyui":  # its outputs under the test's tmp dir, not ./.aigcq
            args = ("--output-dir", str(self.tmp / f"comfyui-{port}"), *args)
        proc = Proc(
            ["emulate", kind, "--port", str(port), *args], {}, self.tmp / f"{kind}-{port}.log"
        )
        self.procs.append(proc.start())
        ready = "/system_stats" if kind == "comfyui" else "/_emulator/stats"
        wait_http(f"http://127.0.0.1:{port}{ready}")
        return f"http://127.0.0.1:{port}"

    def bridge(
        self,
        server_port: int,
        comfyui: list[str],
        *args: str,
        port: int | None = None,
        **env: str,
    ) -> tuple[Proc, int]:
        """``aigcq bridge`` to the server's ``/ws``; its state dir is kept per port."""
        port = port or free_port()
        opts = [f"--comfyui={url}" for url in comfyui]
        proc = Proc(
            [
                "bridge",
                f"--server=ws://127.0.0.1:{server_port}/ws",
                f"--token={BRIDGE_TOKEN}",
                f"--port={port}",
                f"--data-dir={self.tmp / f'bridge-{port}'}",
                *opts,
                *args,
            ],
            env,
            self.tmp / f"bridge-{port}.log",
        )
        self.procs.append(proc.start())
        wait_http(f"http://127.0.0.1:{port}/api/status")
        return proc, port

    def server_env(self, port: int, **extra: str) -> dict[str, str]:
        return {
            "AIGCQ_REDIS_URL": self.redis_url,
            "AIGCQ_WS_PORT": str(port),
            "AIGCQ_CALLBACK_PORT": str(port),
            "AIGCQ_CONFIG_DIR": str(self.config_dir),
            "AIGCQ_DATA_DIR": str(self.tmp / f"data-{port}"),
            "AIGCQ_TOKEN_SECRET": SECRET,
            "AIGCQ_CLIENT_TOKENS": json.dumps([CLIENT_TOKEN]),
            "AIGCQ_ADMIN_TOKEN": ADMIN_TOKEN,
            "AIGCQ_BRIDGE_TOKEN": BRIDGE_TOKEN,
            "AIGCQ_SWEEP_INTERVAL_S": "0.2",
            **extra,
        }

    def server(self, port: int | None = None, **extra: str) -> tuple[Proc, int]:
        port = port or free_port()
        proc = Proc(["serve"], self.server_env(port, **extra), self.tmp / f"serve-{port}.log")
        self.procs.append(proc.start())
        wait_http(f"http://127.0.0.1:{port}/healthz")
        return proc, port

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


MD_PASSWORD = "e2e-md-password"


def start_dispatcher(c: Cluster, port: int | None = None, **extra: str) -> tuple[Proc, int]:
    port = port or free_port()
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
