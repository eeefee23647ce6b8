"""Overflow to Comfy API v2 as a paid target: a serve with no free GPU of its own sends a
``comfyui`` task's graph, as it is, to the real ``comfy-api-proxy`` in front of the ComfyUI
emulator (``comfy_v2``, configured by ``AIGCQ_PLATFORM_URLS``), polls it to its result, and
cancels it there when its client cancels."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from comfy_api_proxy.app import make_app
from comfy_sdk import AsyncComfy
from comfy_sdk.workflows import Workflow

from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.comfyui import invert_graph, read_png
from tests.fakes.fleet import SECRET, fleet, task_of
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

        await f.client.request(task_of("by-id"))  # a registry workflowId, no graph
        await until(
            lambda: f.service.rt.store.reads.timeline("by-id"),
            lambda notes: any("waits for internal" in e["note"] for e in notes),
            within=10,
        )
        held = await f.task("by-id")
        assert held.state == "pending" and not held.remote_id  # nothing sent to comfy_v2

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


@pytest.mark.parametrize("names_the_job", [False, True])
async def test_a_create_whose_answer_is_lost_never_makes_a_second_job(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, names_the_job: bool
) -> None:
    """The proxy creates the job, then its connection dies before the answer. The create is
    sent once more with the attempt's key, which the proxy refuses (single-use):
    ComfyUI sees one prompt. comfy-api-proxy 0.1.6 does not name the job in that refusal,
    so the outcome stays unknown and the task fails ``UncertainSubmit`` at its deadline;
    a server that names it (aigcq's own door does, ``names_the_job``: added here in front
    of the proxy) has the task run as that job."""
    creates: list[str] = []
    first_job: list[str] = []

    @web.middleware
    async def lose_the_first_answer(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        if request.method != "POST" or request.path != "/api/v2/jobs":
            return response
        creates.append(request.headers.get("Idempotency-Key", ""))
        if len(creates) == 1:
            assert isinstance(response, web.Response) and response.text is not None
            first_job.append(json.loads(response.text)["id"])
            assert request.transport is not None
            request.transport.close()  # created, but the answer never leaves
        elif names_the_job and response.status == 422:
            body = {"error": {"code": "idempotency_key_reuse", "message": "used"}}
            body["error"]["details"] = {"job_id": first_job[0]}  # type: ignore[index]
            return web.json_response(body, status=422)
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
                task = await f.task("lost-1")
        finally:
            await runner.cleanup()
    assert creates == ["aigcq-lost-1-1", "aigcq-lost-1-1"]  # the attempt's key, both times
    emulator: ComfyUIEmulator = app.state.emulator
    assert list(emulator.history) == first_job  # one job, the first create's
    if names_the_job:
        assert result["status"] == "success", result
        assert (task.remote_id, task.attempt) == (first_job[0], 1)
    else:
        assert result["status"] == "failed", result
        assert result["error"]["code"] == "UncertainSubmit", result


async def test_a_v2_job_overflows_to_comfy_v2_and_its_output_is_kept_by_aigcq(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both sides at once: ``comfy-sdk`` → aigcq's v2 door → no GPU free → ``comfy_v2`` →
    the real proxy → ComfyUI. The output is copied into aigcq's storage (result custody)
    and downloaded from aigcq, not from the platform."""
    async with (
        proxy_in_front_of_comfy(tmp_path, 0.05) as (proxy, emulator),
        fleet(
            tmp_path, redis, redis_url, [], paid=2, projects=("aigcq",),
            platform_urls={"comfy_v2": proxy}, poll_interval_s=0.2, data_dir=tmp_path / "data",
            result_custody="always",  # a v2 job is delivered to no socket: "offline" skips it
        ) as f,
    ):  # fmt: skip
        base = "http" + f.client.url.split("/?", 1)[0][2:]
        monkeypatch.setenv("COMFY_BASE_URL", base)
        async with AsyncComfy(api_key=issue_client_token(SECRET, "v2-user"), timeout=15) as sdk:
            job = await sdk.submit(Workflow(invert_graph("both")))
            await job.wait(timeout=20)
            assert job.status == "succeeded", job.error
            task = await f.task(job.id)
            assert task.target == "comfy_v2" and task.remote_id in emulator.history
            [entry] = task.result["data"]
            assert entry["sourceUrl"].startswith(proxy)  # the platform's link, kept aside
            assert not entry["fileUrl"].startswith(proxy)  # aigcq's copy
            [out] = job.outputs
            data = await out.to_bytes()
            assert read_png(data)[:2] == (64, 48) and out.size_bytes == len(data)
