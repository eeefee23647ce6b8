"""Real ``aigcq`` processes for the benches and the e2e tests: ``Cluster`` starts servers,
bridges and emulators as ``python -m aigcq ...`` children (each listening on a port it is
told, as in production), everything on 127.0.0.1, with its logs in one directory.

Here (not in ``tests/``) so that a bench runs on its own: ``tests/fakes/processes.py``
adds what only the tests start (dispatchers, model-asynch workers)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from aigcq.plumbing.ports import Ports

#: the client token the real ``aigcq serve`` processes of the e2e tests and benches accept
CLIENT_TOKEN = "e2e-client-token"
ADMIN_TOKEN = "e2e-admin-token"
SECRET = "e2e-secret-with-at-least-32-bytes-of-key"
BRIDGE_TOKEN = "e2e-bridge-token"
#: the management routes' token of the model-asynch processes and services of tests and benches
ASYNCH_ADMIN_TOKEN = "e2e-asynch-admin-token"


#: the reservations of :func:`reserved_port`, given back when this process exits
_FOR_GOOD = Ports()


def reserved_port() -> int:
    """A port reserved (:class:`Ports`) for as long as this process runs: for a child
    server outside a :class:`Cluster` (a test's or a bench's own)."""
    return _FOR_GOOD.take()


class Proc:
    """One ``python -m aigcq ...`` child process (or ``command`` ...) with its log in the
    test's tmp dir."""

    def __init__(
        self, args: list[str], env: dict[str, str], log: Path, command: list[str] | None = None
    ) -> None:
        self.args, self.env, self.log = args, env, log
        self.command = command or [sys.executable, "-m", "aigcq"]
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        out = self.log.open("ab")
        self.p = subprocess.Popen(
            [*self.command, *self.args],
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


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Until ``url`` answers with a status below 500 (its process is up)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not come up in {timeout:.0f} s")
        time.sleep(0.1)


class Cluster:
    """Starts and kills the processes of one test; everything on 127.0.0.1."""

    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.tmp = tmp
        self.redis_url = redis_url
        self.procs: list[Proc] = []
        #: every port a process of this cluster listens on, reserved until :meth:`close`
        self.ports = Ports()
        self.config_dir = tmp / "config"
        self.config_dir.mkdir()

    def write_models(self, models: dict[str, Any]) -> None:
        (self.config_dir / "model.json").write_text(json.dumps(models))

    def emulator(self, kind: str, *args: str) -> str:
        port = self.ports.take()
        if kind == "comfyui":  # its outputs under the test's tmp dir, not ./.aigcq
            args = ("--output-dir", str(self.tmp / f"comfyui-{port}"), *args)
        if kind == "runninghub" and "--workflow-id" not in args:  # the runs' many ids
            args = ("--any-workflow", *args)
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
        command: list[str] | None = None,
        **env: str,
    ) -> tuple[Proc, int]:
        """``aigcq bridge`` to the server's ``/ws``; its state dir is kept per port.
        ``command``: what runs the bridge's options instead (``aigcq-bridge`` alone)."""
        port = port or self.ports.take()
        opts = [f"--comfyui={url}" for url in comfyui]
        proc = Proc(
            [
                *([] if command else ["bridge"]),
                f"--server=ws://127.0.0.1:{server_port}/ws",
                f"--token={BRIDGE_TOKEN}",
                f"--port={port}",
                f"--data-dir={self.tmp / f'bridge-{port}'}",
                *opts,
                *args,
            ],
            env,
            self.tmp / f"bridge-{port}.log",
            command,
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
        port = port or self.ports.take()
        proc = Proc(["serve"], self.server_env(port, **extra), self.tmp / f"serve-{port}.log")
        self.procs.append(proc.start())
        wait_http(f"http://127.0.0.1:{port}/healthz")
        return proc, port

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.ports.close()
