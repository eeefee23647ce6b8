"""An in-process fleet: aigcq (real Redis), real ``aigcq bridge`` agents in front of ComfyUI
emulators, RunningHub's emulator as paid overflow, and a connected client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aigcq.agent.app import Bridge
from aigcq.config import PlatformConfig, Settings
from aigcq.domain import Task
from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.emulators.runninghub import create_app as runninghub_app
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.agent import quick_bridge
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import GRAPH, kill
from tests.fakes.servers import Served, serve_app, serve_killable
from tests.fakes.waiting import until, wait_until

SECRET = "fleet-secret-with-at-least-32-bytes-of-key"
BRIDGE_TOKEN = "fleet-bridge-token"


@dataclass
class Fleet:
    service: ServeProcess
    client: Client
    comfy: list[ComfyUIEmulator]
    bridges: list[Bridge]
    served: list[Served]  # each emulator's server, in the order of :attr:`comfy`

    async def kill_comfy(self, index: int) -> None:
        """The ComfyUI process of emulator ``index`` killed (see :func:`kill`)."""
        await kill(self.served[index], self.comfy[index])

    async def restart_bridge(self, index: int) -> None:
        """Stop the bridge (as a kill would leave it: its tasks unfinished) and start it
        again with the same settings and data folder."""
        old = self.bridges[index]
        await old.stop()
        self.bridges[index] = Bridge(old.settings)
        await self.bridges[index].start()

    async def task(self, task_id: str) -> Task:
        task = await self.service.rt.store.reads.get(task_id)
        assert task is not None
        return task

    async def until_task(self, task_id: str, done: Callable[[Task], bool]) -> Task:
        return await until(lambda: self.task(task_id), done, within=15.0)

    async def result(self, task_id: str) -> dict[str, Any]:
        while True:
            message = await self.client.next(timeout=15.0)
            if message.get("taskId") == task_id and message.get("type") == "result":
                return message


@contextlib.asynccontextmanager
async def fleet(
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    comfy_per_bridge: list[int],
    failure_limit: int = 1,
    comfy_front: Callable[[ASGIApp], ASGIApp] = lambda app: app,
    *,
    paid: int = 5,
    comfy: Callable[[int], dict[str, Any]] = lambda _i: {},
    projects: tuple[str, ...] = ("proj",),
    **overrides: Any,
) -> AsyncIterator[Fleet]:
    """``comfy_per_bridge[b]`` emulators behind bridge ``b``; ``comfy(i)``: settings of the
    ``i``-th emulator (counted over all bridges) other than the defaults, e.g. its
    ``node_classes``; ``paid``: RunningHub's concurrency in model.json (0: no paid
    platform) for each AIGC project of ``projects``; ``overrides``: serve's settings."""
    models = {aigc: {"comfyui": {"apikey": "k", "concurrency": paid}} for aigc in projects}
    (tmp_path / "model.json").write_text(json.dumps(models))
    async with contextlib.AsyncExitStack() as stack:
        rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
        rh_url = await stack.enter_async_context(serve_app(runninghub_app(rh)))
        settings = Settings(
            redis_url=redis_url,
            token_secret=SECRET,
            config_dir=tmp_path,
            bridge_token=BRIDGE_TOKEN,
            runninghub_url=rh_url,
            bridge_failure_limit=failure_limit,
            **({"sweep_interval_s": 0.1} | overrides),
        )
        service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
        base = await stack.enter_async_context(serve_app(service.app))
        settings.callback_url = base
        await redis.set(service.rt.store.keys.workflow("wf-1"), json.dumps(GRAPH))
        emulators, bridges, served = [], [], []
        for b, count in enumerate(comfy_per_bridge):
            urls = []
            for i in range(count):
                out = tmp_path / f"comfy{b}-{i}" / "output"
                config = {"step_time": 0.1, "steps": 3} | comfy(len(emulators))
                app = create_app(ComfyUIConfig(output_dir=out, **config))
                served.append(await stack.enter_async_context(serve_killable(comfy_front(app))))
                urls.append(served[-1].url)
                emulators.append(app.state.emulator)
            server = base.replace("http", "ws") + "/ws"
            bridge_settings = quick_bridge(server, BRIDGE_TOKEN, urls, tmp_path / f"bridge{b}")
            bridge = Bridge(bridge_settings)
            await bridge.start()
            bridges.append(bridge)
        stack.push_async_callback(_stop_all, bridges)
        port = int(base.rsplit(":", 1)[1])
        client = await Client(port, "b1", issue_client_token(SECRET, "b1")).connect()
        stack.push_async_callback(client.close)
        hub = service.hub
        assert hub is not None
        await wait_until(lambda: _free(service) == sum(comfy_per_bridge), 10)
        yield Fleet(service, client, emulators, bridges, served)


class HeldPromptPost:
    """In front of a ComfyUI emulator: the first ``POST /prompt`` waits for :attr:`release`,
    either after ComfyUI queued it (``reply``: the bridge has not heard it was accepted) or
    before ComfyUI sees it, its request read whole (so it is queued even if the bridge gave
    up on it meanwhile)."""

    def __init__(self, app: ASGIApp, *, reply: bool) -> None:
        self.app = app
        self.reply = reply
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self._armed = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_prompt = scope["type"] == "http" and (scope["method"], scope["path"]) == (
            "POST",
            "/prompt",
        )
        if not (is_prompt and self._armed):
            await self.app(scope, receive, send)
            return
        self._armed = False
        if self.reply:

            async def held(message: Message) -> None:
                await self._hold()
                await send(message)

            await self.app(scope, receive, held)
            return
        request = [await receive()]
        while request[-1].get("more_body"):
            request.append(await receive())
        await self._hold()

        async def replay() -> Message:
            return request.pop(0) if request else await receive()

        await self.app(scope, replay, send)

    async def _hold(self) -> None:
        self.holding.set()
        await self.release.wait()


@contextlib.asynccontextmanager
async def held_prompt_fleet(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, *, reply: bool
) -> AsyncIterator[tuple[Fleet, HeldPromptPost]]:
    """One bridge, one ComfyUI behind a :class:`HeldPromptPost`; the hold is released on
    exit, whatever the test did."""
    front: list[HeldPromptPost] = []

    def hold(app: ASGIApp) -> ASGIApp:
        front.append(HeldPromptPost(app, reply=reply))
        return front[-1]

    async with fleet(tmp_path, redis, redis_url, [1], comfy_front=hold) as f:
        try:
            yield f, front[0]
        finally:
            front[0].release.set()


async def _stop_all(bridges: list[Bridge]) -> None:
    for bridge in bridges:
        await bridge.stop()


def _free(service: ServeProcess) -> int:
    assert service.hub is not None
    return service.hub.free_slots()


def task_of(task_id: str, **payload: Any) -> dict[str, Any]:
    return generate(task_id, **(payload or {"workflowId": "wf-1", "nodeInfoList": []}))
