"""``aigcq up --demo``: the server plus emulated GPUs and an emulated RunningHub.

Beside the server it starts, as child processes: two ComfyUI emulators, one ``aigcq
bridge`` in front of them, and a RunningHub emulator with a small cap. The demo's
``model.json`` (comfyui → that RunningHub) and every log live under
``<data dir>/demo/``; the user's ``config/`` is not read. The demo workflow (the
weight-free EmptyImage → ImageInvert → SaveImage graph) is put in the workflow registry as
``demo``, so ``aigcq submit comfyui '{"workflowId":"demo"}'`` works at once: the first
tasks run on the bridge, the next ones overflow to RunningHub up to its cap, the rest wait.
Ctrl-C (or SIGTERM) stops the server, then the children.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console

from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.ports import Ports
from aigcq.queue.keys import Keys

WORKFLOW_ID = "demo"
#: the command that mints the demo's client token, for the ids its banner's commands use
CLIENT_TOKEN_COMMAND = "aigcq token demo --ttl 604800" + "".join(
    f" --id demo-{i}" for i in range(1, 7)
)
GRAPH = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 256, "height": 256, "batch_size": 1, "color": 0x3366CC},
    },
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "demo"}},
}
DEMO_APIKEY = "demo-runninghub-key-0123456789abcdef"
DEMO_JIMUAI_AK, DEMO_JIMUAI_SK = "AKLTdemo", "demo-jimuai-secret"
PR_SET_PDEATHSIG = 1


class DemoOptions(BaseSettings):
    """How busy the demo's GPUs are: a prompt takes ``3 nodes × steps × step_time`` s.

    Every field reads ``AIGCQ_DEMO_<NAME>`` (e.g. ``AIGCQ_DEMO_STEP_TIME=0.1``).
    """

    model_config = SettingsConfigDict(env_prefix="AIGCQ_DEMO_", extra="ignore")

    instances: int = Field(2, ge=1)
    step_time: float = Field(0.5, ge=0)
    steps: int = Field(4, ge=1)
    runninghub_cap: int = Field(2, ge=0)
    runninghub_duration: float = Field(4.0, ge=0)
    jimuai_cap: int = Field(2, ge=0)
    jimuai_duration: float = Field(3.0, ge=0)
    # Where the demo's helpers listen (0: any free port); printed at start.
    runninghub_port: int = Field(0, ge=0)
    jimuai_port: int = Field(0, ge=0)
    comfyui_port: int = Field(0, ge=0, description="The first instance's; the next ones +1.")
    bridge_port: int = Field(0, ge=0, description="The bridge's admin page.")


def _port_settings(options: DemoOptions) -> list[tuple[int, str]]:
    """The demo's fixed ports, each with its setting."""
    comfyui = [
        (options.comfyui_port + i, "AIGCQ_DEMO_COMFYUI_PORT")
        for i in range(options.instances)
        if options.comfyui_port
    ]
    return [
        (options.runninghub_port, "AIGCQ_DEMO_RUNNINGHUB_PORT"),
        (options.jimuai_port, "AIGCQ_DEMO_JIMUAI_PORT"),
        *comfyui,
        (options.bridge_port, "AIGCQ_DEMO_BRIDGE_PORT"),
    ]


def _comfyui_ports(ports: Ports, options: DemoOptions) -> list[int]:
    if options.comfyui_port:
        return [options.comfyui_port + i for i in range(options.instances)]
    return [ports.take() for _ in range(options.instances)]


def demo_host(settings: Settings) -> str:
    """Where the demo's helpers listen: the server's address, the loopback for a wildcard."""
    return "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the demo process dies (even SIGKILLed)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """One ``python -m aigcq ...`` child in its own session (Ctrl-C reaches us first)."""

    def __init__(
        self, name: str, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name, self.args, self.log, self.env = name, args, log, env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> Child:
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aigcq", *self.args],
            env={**os.environ, **self.env},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        return self

    def stop(self, timeout: float = 5.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._out is not None:
            self._out.close()


@dataclass(slots=True)
class Demo:
    """Where everything runs; :meth:`plan` decides, :func:`run` starts it."""

    settings: Settings
    options: DemoOptions
    root: Path
    host: str
    runninghub: str
    jimuai: str
    comfyui: list[str]
    bridge_port: int

    @classmethod
    def plan(cls, settings: Settings, options: DemoOptions, ports: Ports | None = None) -> Demo:
        """The demo's layout; the ports not set are taken from ``ports`` (reserved until
        it is closed, so no other program takes one before its child listens)."""
        host = demo_host(settings)
        ports = ports or Ports(host)
        root = settings.data_dir / "demo"
        return cls(
            settings=settings,
            options=options,
            root=root,
            host=host,
            runninghub=f"http://{host}:{options.runninghub_port or ports.take()}",
            jimuai=f"http://{host}:{options.jimuai_port or ports.take()}",
            comfyui=[f"http://{host}:{port}" for port in _comfyui_ports(ports, options)],
            bridge_port=options.bridge_port or ports.take(),
        )

    @property
    def server_ws(self) -> str:
        return f"ws://{self.host}:{self.settings.ws_port}"

    def write_config(self) -> PlatformConfig:
        """The demo's model.json under the data dir; the server reads it instead of config/."""
        config_dir = self.root / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        account = {"apikey": DEMO_APIKEY, "concurrency": self.options.runninghub_cap}
        jimuai = {
            "access_key": DEMO_JIMUAI_AK,
            "secret_key": DEMO_JIMUAI_SK,
            "concurrency": self.options.jimuai_cap,
            "req_key": "jimeng_t2i_v40",
        }
        models = {self.settings.project_prefix: {"comfyui": account, "jimuai": jimuai}}
        (config_dir / "model.json").write_text(json.dumps(models, indent=2))
        self.settings.config_dir = config_dir
        self.settings.runninghub_url = self.runninghub
        self.settings.jimuai_url = self.jimuai
        if self.settings.poll_interval_s is None:  # the seed's 5-30 s is long for a demo
            self.settings.poll_interval_s = 1.0
        return PlatformConfig.load(config_dir)

    def emulators(self) -> list[Child]:
        o, logs = self.options, self.root / "logs"
        port = self.runninghub.rsplit(":", 1)[1]
        children = [
            Child(
                "runninghub",
                [
                    *("emulate", "runninghub", "--host", self.host, "--port", port),
                    *("--max-concurrent", str(o.runninghub_cap)),
                    *("--duration", str(o.runninghub_duration), "--api-key", DEMO_APIKEY),
                    *("--workflow-id", WORKFLOW_ID),
                ],
                logs / "runninghub.log",
            ),
            Child(
                "jimuai",
                [
                    *("emulate", "jimuai", "--host", self.host),
                    *("--port", self.jimuai.rsplit(":", 1)[1]),
                    *("--access-key", DEMO_JIMUAI_AK, "--secret-key", DEMO_JIMUAI_SK),
                    *("--max-concurrent", str(o.jimuai_cap), "--queue", "1"),
                    *("--duration", str(o.jimuai_duration)),
                ],
                logs / "jimuai.log",
            ),
        ]
        for i, url in enumerate(self.comfyui, 1):
            children.append(
                Child(
                    f"comfyui-{i}",
                    [
                        *("emulate", "comfyui", "--host", self.host),
                        *("--port", url.rsplit(":", 1)[1]),
                        *("--step-time", str(o.step_time), "--steps", str(o.steps)),
                        *("--output-dir", str(self.root / f"comfyui-{i}")),
                    ],
                    logs / f"comfyui-{i}.log",
                )
            )
        return children

    def bridge(self) -> Child:
        args = ["bridge", "--server", f"{self.server_ws}/ws"]
        # The hub frees a slot on the next HEARTBEAT, so beat often: freed GPUs show at once.
        args += ["--host", self.host, "--port", str(self.bridge_port), "--heartbeat", "1"]
        args += ["--data-dir", str(self.root / "bridge")]
        for url in self.comfyui:
            args += ["--comfyui", url]
        token = {"AIGCQ_BRIDGE_TOKEN": self.settings.bridge_token}  # not in `ps`
        return Child("bridge", args, self.root / "logs" / "bridge.log", env=token)

    def banner(self, console: Console) -> None:
        from aigcq.cli.banner import dashboard_link, secrets_note

        o, s = self.options, self.settings
        seconds = 3 * o.steps * o.step_time
        payload = json.dumps({"workflowId": WORKFLOW_ID, "nodeInfoList": []}, separators=(",", ":"))
        submit = f"aigcq submit comfyui {shlex.quote(payload)} --server {self.server_ws}/"
        http = f"http://{self.host}:{s.ws_port}"
        lines = [
            "[bold]aigcq demo[/bold]: your GPUs first, RunningHub on overflow",
            f"  server      {self.server_ws}/ (clients), {http}/docs (HTTP API)",
            f"  dashboard   {dashboard_link(s, self.host)}",
            f"  GPUs        {o.instances} emulated ComfyUI instances, {seconds:g} s a prompt: "
            + ", ".join(self.comfyui),
            f"  bridge      http://{self.host}:{self.bridge_port}/ (admin page) in front of them",
            f"  RunningHub  {self.runninghub} (emulated: at most {o.runninghub_cap} at once, "
            f"{o.runninghub_duration:g} s a task)",
            f"  JimuAI      {self.jimuai} (emulated 即梦: at most {o.jimuai_cap} at once, "
            f"{o.jimuai_duration:g} s a task, polled)",
            f"  config      {self.root / 'config' / 'model.json'} (./config is not used)",
            f"  logs        {self.root / 'logs'}/",
            f"  secrets     {secrets_note(s) or 'all set in the environment'}",
            "",
            "A client token for the ids below (signed with the secret kept here; a banner "
            "shows no secret):",
            f"  export AIGCQ_CLIENT_TOKEN=$({CLIENT_TOKEN_COMMAND})",
            "One task (its fileUrl shows where it ran: the bridge, or RunningHub):",
            f"  {submit}",
            "",
            f"Six at once: {o.instances} run on the GPUs, {o.runninghub_cap} overflow to "
            "RunningHub, the rest wait for a free slot:",
            f"  for i in 1 2 3 4 5 6; do {submit} --backend-id demo-$i & done; wait",
            f"  aigcq status --server {http}",
            "",
            "A JimuAI (即梦) image, polled from its emulator:",
            f'  aigcq submit jimuai \'{{"prompt":"a red fox"}}\' --server {self.server_ws}/',
            "",
        ]
        for line in lines:
            console.print(line, soft_wrap=True, highlight=False)


async def put_workflow(redis_url: str, prefix: str) -> None:
    """The demo workflow into the registry (what ``PUT /api/workflows/demo`` does)."""
    from aigcq.plumbing.redis_client import redis_client

    client = redis_client(redis_url)
    try:
        await client.set(Keys(prefix).workflow(WORKFLOW_ID), orjson.dumps(GRAPH))
    finally:
        await client.aclose()


async def _serve_then_bridge(demo: Demo, config: PlatformConfig, bridge: Child) -> None:
    """Run the server; start the bridge once the server accepts connections."""
    from aigcq.serve.launch import serve

    await put_workflow(demo.settings.redis_url, demo.settings.project_prefix)
    server = asyncio.create_task(serve(demo.settings, config))
    deadline = time.monotonic() + 30
    while not server.done() and time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection(demo.host, demo.settings.ws_port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        bridge.start()
        break
    await server


def run(settings: Settings, console: Console, options: DemoOptions | None = None) -> None:
    """Blocking entry point of ``aigcq up --demo``."""
    from aigcq.cli.common import require_free_ports
    from aigcq.serve.launch import ensure_secrets, run_with_redis

    options = options or DemoOptions()
    require_free_ports(demo_host(settings), _port_settings(options))
    ensure_secrets(settings)
    ports = Ports(demo_host(settings))  # held until the demo's children stop
    demo = Demo.plan(settings, options, ports)
    config = demo.write_config()
    children = [c.start() for c in demo.emulators()]
    bridge = demo.bridge()
    try:
        demo.banner(console)
        # run_with_redis: the embedded Redis when AIGCQ_REDIS_URL is unset; SIGTERM and
        # Ctrl-C end it normally, so the children are stopped below either way.
        run_with_redis(
            settings,
            config,
            embedded_dir=settings.data_dir / "redis",
            main=lambda: _serve_then_bridge(demo, config, bridge),
        )
    finally:
        for child in [bridge, *reversed(children)]:
            child.stop()
        ports.close()
        console.print("aigcq demo stopped")
