"""Overflow to Comfy API v2 as a paid target: a serve with no free GPU of its own sends a
``comfyui`` task's graph, as it is, to the real ``comfy-api-proxy`` in front of the ComfyUI
emulator (``comfy_v2``, configured by ``AIGCQ_PLATFORM_URLS``), polls it to its result, and
cancels it there when its client cancels."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from aiohttp import web
from comfy_api_proxy.app import make_app

from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from tests.fakes.comfyui import invert_graph, read_png
from tests.fakes.fleet import fleet, task_of
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until


@asynccontextmanager
async def proxy_in_front_of_comfy(
    tmp_path: Path, step_time: float
) -> AsyncIterator[tuple[str, ComfyUIEmulator]]:
    app = create_app(ComfyUIConfig(output_dir=tmp_path / "v2out", step_time=step_time, steps=5))
    async with serve_app(app) as comfy:
        runner = web.AppRunner(make_app(comfy))
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.emulator
        finally:
            await runner.cleanup()


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def test_a_comfyui_task_overflows_to_comfy_v2_with_its_graph_and_is_cancelled_there(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with (
        proxy_in_front_of_comfy(tmp_path, 0.2) as (proxy, emulator),
        fleet(
            tmp_path, redis, redis_url, [], paid=2,
            platform_urls={"comfy_v2": proxy}, poll_interval_s=0.2,
        ) as f,
    ):  # fmt: skip
        await f.client.request(task_of("paid-1", workflow=invert_graph("pd")))
        result = await f.result("paid-1")
        assert result["status"] == "success", result
        task = await f.task("paid-1")
        assert (task.target, task.attempt) == ("comfy_v2", 1)
        assert task.remote_id in emulator.history  # the proxy's job, under its own id
        [file] = result["data"]["data"]
        assert file["fileUrl"].startswith(f"{proxy}/api/v2/assets/") and file["nodeId"] == "3"
        async with httpx.AsyncClient() as http:
            image = await http.get(file["fileUrl"])
        assert image.status_code == 200 and read_png(image.content)[:2] == (64, 48)

        await f.client.request(task_of("paid-2", workflow=invert_graph("pd2")))
        running = await f.until_task("paid-2", lambda t: bool(t.remote_id))
        await until(lambda: _running(emulator), lambda p: p == running.remote_id, within=10)
        reply = await f.client.request({"type": "cancel", "taskId": "paid-2"})
        assert reply["type"] == "cancelled"
        entry = await until(
            lambda: _history(emulator, running.remote_id), bool, within=10
        )  # the cancel reached the proxy, and through it the GPU
        assert entry["status"]["messages"][-1][0] == "execution_interrupted"


async def _history(emulator: ComfyUIEmulator, prompt_id: str) -> dict[str, object]:
    return emulator.history.get(prompt_id) or {}


async def test_a_create_whose_answer_is_lost_is_never_sent_twice(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The proxy creates the job, then its connection dies before the answer: the create's
    outcome is unknown, so it is not sent again (the task fails ``UncertainSubmit`` at its
    deadline) and ComfyUI saw exactly one prompt."""
    creates: list[str] = []

    @web.middleware
    async def lose_the_first_answer(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        if request.method == "POST" and request.path == "/api/v2/jobs":
            creates.append(request.headers.get("Idempotency-Key", ""))
            if len(creates) == 1 and request.transport is not None:
                request.transport.close()  # created, but the answer never leaves
        return response

    app = create_app(ComfyUIConfig(output_dir=tmp_path / "lost", step_time=0.05, steps=2))
    async with serve_app(app) as comfy:
        runner = web.AppRunner(make_app(comfy, middlewares=[lose_the_first_answer]))
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        proxy = f"http://127.0.0.1:{sock.getsockname()[1]}"
        try:
            async with fleet(
                tmp_path, redis, redis_url, [], paid=2,
                platform_urls={"comfy_v2": proxy}, poll_interval_s=0.2, task_deadline_s=2.0,
            ) as f:  # fmt: skip
                await f.client.request(task_of("lost-1", workflow=invert_graph("lost")))
                result = await f.result("lost-1")
                assert result["status"] == "failed", result
                assert result["error"]["code"] == "UncertainSubmit", result
        finally:
            await runner.cleanup()
    assert creates == ["aigcq-lost-1-1"]  # one create for the attempt, never a second
    emulator: ComfyUIEmulator = app.state.emulator
    assert len(emulator.history) == 1  # the one job the lost answer was about
