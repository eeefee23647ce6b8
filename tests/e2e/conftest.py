"""End-to-end harness: real ``aigcq`` processes, real Redis, emulators as processes."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import pytest
import websockets

from aigcq.embedded.redis import EmbeddedRedis

CLIENT_TOKEN = "e2e-client-token"
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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    redis = EmbeddedRedis(tmp_path / "redis", persist=True)
    c = Cluster(tmp_path, redis.start())
    try:
        yield c
    finally:
        c.close()
        redis.stop()


class Client:
    """A business backend on the client WebSocket, counting results per taskId."""

    def __init__(self, port: int, backend_id: str, token: str = CLIENT_TOKEN) -> None:
        query = urlencode({"token": token, "id": backend_id})
        self.url = f"ws://127.0.0.1:{port}/?{query}"
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.replies: list[dict[str, Any]] = []
        self.ws: Any = None

    async def connect(self) -> Client:
        self.ws = await websockets.connect(self.url, max_size=None)
        return self

    async def close(self) -> None:
        await self.ws.close()

    async def resumed(
        self, restart: Callable[[], object], count: int, *, linger: float = 0.5
    ) -> Client:
        """Drop this connection, ``restart`` the server, and come back as the same backend
        with the results got so far (as a business backend keeps them); then read until
        ``count`` tasks have a result, and ``linger`` to catch duplicates."""
        await self.ws.close()
        restart()
        again = copy.copy(self)  # same URL: the same backend
        again.replies = []
        again.results = {task_id: list(msgs) for task_id, msgs in self.results.items()}
        await again.connect()
        await again.collect(count, timeout=60)
        await again.linger(linger)
        return again

    async def send(self, message: dict[str, Any] | str) -> None:
        await self.ws.send(message if isinstance(message, str) else orjson.dumps(message).decode())

    async def request(self, message: dict[str, Any] | str) -> dict[str, Any]:
        """Send and return the next non-result reply."""
        await self.send(message)
        while True:
            msg = await self.next()
            if msg["type"] != "result":
                return msg

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        msg: dict[str, Any] = orjson.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        if msg["type"] == "result":
            self.results.setdefault(msg["taskId"], []).append(msg)
        else:
            self.replies.append(msg)
        return msg

    async def collect(self, count: int, timeout: float = 30.0) -> None:
        """Read until ``count`` distinct tasks have a result (or time out)."""
        deadline = time.monotonic() + timeout
        while len(self.results) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self.results)}/{count} results")
            try:
                await self.next(timeout=left)
            except (TimeoutError, websockets.ConnectionClosed):
                raise TimeoutError(f"{len(self.results)}/{count} results") from None

    async def linger(self, seconds: float) -> None:
        """Keep reading for a while to catch duplicates."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                await self.next(timeout=left)
            except TimeoutError:
                return


def generate(
    task_id: str, platform: str = "comfyui", aigc: str = "proj", **payload: Any
) -> dict[str, Any]:
    payload = payload or {"workflowId": "1904136902449209346", "nodeInfoList": []}
    return {
        "type": "generate",
        "taskId": task_id,
        "platform": platform,
        "AIGC": aigc,
        "payload": payload,
    }
