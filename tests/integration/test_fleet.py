"""The whole internal chain in one process: a client, aigcq (real Redis), the real
``aigcq bridge`` agent and ComfyUI emulators, with the RunningHub emulator as paid overflow.

A client's mistake fails its task and leaves the bridge alone; a machine's failure is
retried within max_attempts; a cancel reaches the GPU; an idle GPU is used, not paid for."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
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
from tests.fakes.comfyui import GRAPH
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until, wait_until

SECRET = "fleet-secret-with-at-least-32-bytes-of-key"
BRIDGE_TOKEN = "fleet-bridge-token"


@dataclass
class Fleet:
    service: ServeProcess
    client: Client
    comfy: list[ComfyUIEmulator]
    bridges: list[Bridge]

    async def restart_bridge(self, index: int) -> None:
        """Stop the bridge (as a kill would leave it: its tasks unfinished) and start it
        again with the same settings and data folder."""
        old = self.bridges[index]
        await old.stop()
        self.bridges[index] = Bridge(old.settings)
        await self.bridges[index].start()

    async def task(self, task_id: str) -> Task:
        task = await self.service.rt.store.get(task_id)
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
) -> AsyncIterator[Fleet]:
    models = {"proj": {"comfyui": {"apikey": "k", "concurrency": 5}}}
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
            sweep_interval_s=0.1,
        )
        service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
        base = await stack.enter_async_context(serve_app(service.app))
        settings.callback_url = base
        await redis.set(service.rt.store.keys.workflow("wf-1"), json.dumps(GRAPH))
        emulators, bridges = [], []
        for b, count in enumerate(comfy_per_bridge):
            urls = []
            for i in range(count):
                out = tmp_path / f"comfy{b}-{i}" / "output"
                app = create_app(ComfyUIConfig(output_dir=out, step_time=0.1, steps=3))
                urls.append(await stack.enter_async_context(serve_app(comfy_front(app))))
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
        yield Fleet(service, client, emulators, bridges)


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


@pytest.fixture
async def one_gpu(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Fleet]:
    async with fleet(tmp_path, redis, redis_url, [1]) as f:
        yield f


async def test_an_invalid_workflow_fails_its_task_and_leaves_the_bridge_in_rotation(
    one_gpu: Fleet,
) -> None:
    bad = {"1": {"class_type": "EmptyImage", "inputs": {"width": "wide"}}}
    bad["2"] = {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}
    await one_gpu.client.request(task_of("bad", workflow=bad))
    result = await one_gpu.result("bad")
    assert result["status"] == "failed", result
    error = result["error"]
    assert error["code"] == "PromptValidation" and error["detail"] == {"class": "task"}
    assert "prompt_outputs_failed_validation" in error["message"]
    assert (await one_gpu.task("bad")).attempt == 1  # not retried
    hub = one_gpu.service.hub
    assert hub is not None
    conn = hub.registry.bridges[one_gpu.bridges[0].bridge_id]
    assert conn.quarantined_at is None  # bridge_failure_limit is 1: a count would take it out
    await one_gpu.client.request(task_of("good"))
    assert (await one_gpu.result("good"))["status"] == "success"
    assert (await one_gpu.task("good")).target == "bridge"


async def test_an_unknown_workflow_fails_at_once_with_workflow_not_found(one_gpu: Fleet) -> None:
    await one_gpu.client.request(task_of("lost", workflowId="nope", nodeInfoList=[]))
    result = await one_gpu.result("lost")
    assert result["status"] == "failed"
    assert result["error"]["code"] == "WorkflowNotFound"


async def test_a_prompt_comfyui_forgot_is_retried_and_finishes(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with fleet(tmp_path, redis, redis_url, [1], failure_limit=3) as one_gpu:
        await _forgotten_and_retried(one_gpu)


async def _forgotten_and_retried(one_gpu: Fleet) -> None:
    await one_gpu.client.request(task_of("forgot"))
    await one_gpu.until_task("forgot", lambda t: t.state == "running")
    await until(lambda: _running(one_gpu.comfy[0]), bool)
    await one_gpu.comfy[0].restart()  # faster than any health check
    result = await one_gpu.result("forgot")
    assert result["status"] == "success"
    task = await one_gpu.task("forgot")
    assert (task.attempt, task.target) == (2, "bridge")


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def test_a_cancel_stops_the_prompt_and_the_idle_gpu_takes_the_next_task(
    one_gpu: Fleet,
) -> None:
    await one_gpu.client.request(task_of("stop"))
    await until(lambda: _running(one_gpu.comfy[0]), lambda p: p == "stop", within=10)
    reply = await one_gpu.client.request({"type": "cancel", "taskId": "stop"})
    assert reply["type"] == "cancelled"
    entry = await until(lambda: _history(one_gpu.comfy[0], "stop"), bool, within=10)
    assert entry["status"]["messages"][-1][0] == "execution_interrupted"
    await one_gpu.client.request(task_of("next"))
    assert (await one_gpu.result("next"))["status"] == "success"
    assert (await one_gpu.task("next")).target == "bridge"  # not the paid platform


async def _history(emulator: ComfyUIEmulator, prompt_id: str) -> dict[str, Any]:
    return emulator.history.get(prompt_id) or {}


async def test_an_instance_that_dies_mid_run_is_retried_on_another_bridge(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with fleet(tmp_path, redis, redis_url, [1, 1]) as f:
        await f.client.request(task_of("die"))
        running = await until(lambda: _running_on(f.comfy), lambda i: i is not None, within=10)
        assert running is not None
        f.comfy[running].config.fail_next = 0
        await f.comfy[running].restart()
        f.bridges[running].pool.instances[0].healthy = False  # as its check finds it down
        result = await f.result("die")
        assert result["status"] == "success"
        assert (await f.task("die")).attempt == 2


async def _running_on(emulators: list[ComfyUIEmulator]) -> int | None:
    return next((i for i, e in enumerate(emulators) if e.running), None)


async def test_a_restarted_bridge_readopts_its_prompt_instead_of_running_it_again(
    one_gpu: Fleet,
) -> None:
    await one_gpu.client.request(task_of("keep"))
    await until(lambda: _running(one_gpu.comfy[0]), lambda p: p == "keep", within=10)
    await one_gpu.restart_bridge(0)
    result = await one_gpu.result("keep")
    assert result["status"] == "success"
    task = await one_gpu.task("keep")
    assert (task.attempt, task.target) == (1, "bridge")
    assert list(one_gpu.comfy[0].history) == ["keep"]  # ran once, never as "keep-2"


async def test_a_bridge_stopped_before_comfyui_answered_its_submit_readopts_the_prompt(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The worst moment for a restart: ComfyUI took the prompt, the bridge has not heard."""
    async with held_prompt_fleet(tmp_path, redis, redis_url, reply=True) as (f, front):
        await f.client.request(task_of("keep"))
        await asyncio.wait_for(front.holding.wait(), 10)
        await f.restart_bridge(0)
        front.release.set()
        result = await f.result("keep")
        assert result["status"] == "success"
        task = await f.task("keep")
        assert (task.attempt, task.target) == (1, "bridge")
        assert list(f.comfy[0].history) == ["keep"]  # ran once, never as "keep-2"


async def test_a_cancel_while_the_prompt_is_on_its_way_stops_it_once_comfyui_queued_it(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """A TASK_CANCEL between the bridge's POST /prompt and ComfyUI queueing it: the queue had
    nothing to delete yet, and the prompt must not run on the slot the hub gave away."""
    async with held_prompt_fleet(tmp_path, redis, redis_url, reply=False) as (f, front):
        runner = f.bridges[0].runner
        await f.client.request(task_of("late"))
        await asyncio.wait_for(front.holding.wait(), 10)
        reply = await f.client.request({"type": "cancel", "taskId": "late"})
        assert reply["type"] == "cancelled"
        await until(lambda: _cancelled_or_gone(runner.running, "late"), bool, within=10)
        front.release.set()  # ComfyUI queues "late" now
        await f.client.request(task_of("next"))
        assert (await f.result("next"))["status"] == "success"
        late = f.comfy[0].history.get("late")
        # deleted from the queue (no history), or interrupted if it had started; never run
        assert late is None or late["status"]["messages"][-1][0] == "execution_interrupted", late
        assert list(f.comfy[0].history)[-1] == "next"


async def _cancelled_or_gone(running: dict[str, Any], task_id: str) -> bool:
    task = running.get(task_id)
    return task is None or bool(task.cancelled)
