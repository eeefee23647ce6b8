"""A tiny bridge hub and webhook receiver for testing our reference bridge alone: it
records what the bridge sends, lets the test send TASK_ASSIGN/PING, and serves one
workflow from ``/api/workflows/{id}`` as aigcq's registry does."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from aigcq.agent.settings import BridgeSettings
from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from tests.fakes.agent import quick_bridge
from tests.fakes.comfyui import GRAPH
from tests.fakes.servers import Received, Recorder, serve_app
from tests.fakes.waiting import until

TOKEN = "bridge-secret"


class Hub:
    """A minimal bridge hub: one WebSocket endpoint and a workflow registry."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sockets: list[WebSocket] = []
        self.app = Starlette(
            routes=[
                WebSocketRoute("/ws", self._ws),
                Route("/api/workflows/{wid}", self._workflow),
            ]
        )

    async def _ws(self, ws: WebSocket) -> None:
        if ws.query_params.get("token") != TOKEN:
            await ws.close(code=4401)
            return
        await ws.accept()
        self.sockets.append(ws)
        try:
            while True:
                self.inbox.put_nowait(json.loads(await ws.receive_text()))
        except WebSocketDisconnect:
            pass
        finally:
            self.sockets.remove(ws)

    async def _workflow(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return Response(status_code=401)
        if request.path_params["wid"] != "wf-1":
            return Response(status_code=404)
        return JSONResponse(GRAPH)

    async def send(self, type_: str, data: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"type": type_} | ({"data": data} if data else {})
        await self.sockets[-1].send_text(json.dumps(message))

    async def next(self, type_: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next message of ``type_`` (others are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.inbox.get()
                if message["type"] == type_:
                    data: dict[str, Any] = message.get("data", {})
                    return data


@dataclass
class Env:
    hub: Hub
    hub_url: str
    webhook: Recorder
    webhook_url: str
    comfy: list[str]
    emulators: list[ComfyUIEmulator]
    settings: BridgeSettings
    http: httpx.AsyncClient

    def assign(self, task_id: str, **extra: Any) -> dict[str, Any]:
        return {
            "taskId": task_id,
            "attempt": 1,
            "workflowId": "wf-1",
            "nodeInfoList": [],
            "webhookUrl": f"{self.webhook_url}/callback/{task_id}?sig=abc",
            **extra,
        }

    async def end_for(self, task_id: str) -> dict[str, Any]:
        """The eventData of the first accepted TASK_END for ``task_id``."""

        async def accepted() -> list[Received]:
            received = self.webhook.received[self.webhook.fail_first :]
            return [r for r in received if r.path == f"/callback/{task_id}"]

        first = (await until(accepted, bool, within=10.0))[0]
        body = first.json()
        assert (body["event"], body["taskId"], first.query) == ("TASK_END", task_id, "sig=abc")
        result: dict[str, Any] = json.loads(body["eventData"])
        return result


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    hub, webhook = Hub(), Recorder()
    comfy_configs = [
        ComfyUIConfig(output_dir=tmp_path / f"comfy{i}" / "output", step_time=0.03, steps=2)
        for i in range(2)
    ]
    async with contextlib.AsyncExitStack() as stack:
        hub_url = await stack.enter_async_context(serve_app(hub.app))
        webhook_url = await stack.enter_async_context(serve_app(webhook.app))
        apps = [create_app(c) for c in comfy_configs]
        comfy = [await stack.enter_async_context(serve_app(app)) for app in apps]
        http = await stack.enter_async_context(httpx.AsyncClient())
        server = hub_url.replace("http", "ws") + "/ws"
        settings = quick_bridge(server, TOKEN, comfy, tmp_path / "bridge", ws_silence=0.5)
        emulators = [app.state.emulator for app in apps]
        yield Env(hub, hub_url, webhook, webhook_url, comfy, emulators, settings, http)


async def assign_three_to_two(env: Env) -> dict[str, dict[str, Any]]:
    """With the bridge registered: tasks a, b and c assigned to its two instances; each
    TASK_ACK by task (c's is the refusal: both instances are busy)."""
    await env.hub.next("REGISTER")
    for task_id in ("a", "b", "c"):
        await env.hub.send("TASK_ASSIGN", env.assign(task_id, workflow=GRAPH))
    acks = {}
    for _ in range(3):
        ack = await env.hub.next("TASK_ACK")
        acks[ack["data"]["taskId"]] = ack
    return acks
