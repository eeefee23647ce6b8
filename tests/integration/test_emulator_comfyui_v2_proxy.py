"""The real ``comfy-api-proxy`` (Comfy API v2 in front of one ComfyUI) in front of aigcq's
ComfyUI emulator, driven by the unchanged ``comfy-sdk``: the emulator does what the proxy
needs from ComfyUI core — it honours the given ``prompt_id`` and serves
``POST /api/jobs/{id}/cancel`` (interrupt if running, dequeue if pending), so a cancel
through the proxy ends ``canceled`` rather than ``succeeded``."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from comfy_api_proxy.app import make_app
from comfy_sdk import AsyncComfy
from comfy_sdk.workflows import Workflow

from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from tests.fakes.comfyui import invert_graph, read_png
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until


@pytest.fixture
async def proxied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AsyncComfy, ComfyUIEmulator, str]]:
    app = create_app(ComfyUIConfig(output_dir=tmp_path / "out", step_time=0.3, steps=5))
    async with serve_app(app) as comfy:
        runner = web.AppRunner(make_app(comfy))
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        monkeypatch.setenv("COMFY_BASE_URL", base)
        try:
            async with AsyncComfy(timeout=15.0) as sdk:
                yield sdk, app.state.emulator, comfy
        finally:
            await runner.cleanup()


def _status_of(job: Any) -> Any:
    async def read() -> str:
        await job.refresh()
        return str(job.status)

    return read


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def test_a_job_runs_under_its_own_id_and_its_output_downloads(
    proxied: tuple[AsyncComfy, ComfyUIEmulator, str],
) -> None:
    sdk, emulator, _comfy = proxied
    job = await sdk.submit(Workflow(invert_graph("px")))
    await job.wait(timeout=15)
    assert job.status == "succeeded"
    assert job.id in emulator.history  # the proxy's job id is the prompt id
    [out] = job.outputs
    assert read_png(await out.to_bytes())[:2] == (64, 48)


async def test_cancel_through_the_proxy_stops_the_prompt_or_takes_it_off_the_queue(
    proxied: tuple[AsyncComfy, ComfyUIEmulator, str],
) -> None:
    sdk, emulator, comfy = proxied
    running = await sdk.submit(Workflow(invert_graph("r")))
    await until(lambda: _running(emulator), lambda p: p == running.id, within=10)
    waiting = await sdk.submit(Workflow(invert_graph("w")))
    await waiting.cancel()
    assert waiting.id not in {i.prompt_id for i in emulator.pending}
    await running.cancel()
    assert running.status in ("canceling", "canceled")
    await running.wait(timeout=15)
    # The proxy reads /history, then /queue: a prompt that ends between the two reads is in
    # neither, and is reported "expired" once (real ComfyUI races the same way); read again.
    final = await until(_status_of(running), lambda s: s != "expired", within=5)
    assert final == "canceled"
    messages = emulator.history[running.id]["status"]["messages"]
    assert messages[-1][0] == "execution_interrupted"
    async with httpx.AsyncClient() as http:
        unknown = await http.post(f"{comfy}/api/jobs/nope/cancel")
    assert unknown.status_code == 404
