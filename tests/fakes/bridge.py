"""A bridge written with websockets (``Bridge``): what the hub sees of a GPU machine."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import websockets

if TYPE_CHECKING:
    from tests.fakes.service import Env

#: the bridge token of the in-process services (``Settings(bridge_token=...)``)
BRIDGE_TOKEN = "bridge-token"


class Bridge:
    """A minimal bridge: send frames, read the hub's frames (PINGs are skipped)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def connect(cls, port: int, token: str | None = BRIDGE_TOKEN) -> Bridge:
        query = f"?token={token}" if token is not None else ""
        return cls(await websockets.connect(f"ws://127.0.0.1:{port}/ws{query}"))

    async def send(self, kind: str | dict[str, Any], data: dict[str, Any] | None = None) -> None:
        raw = kind if isinstance(kind, dict) else {"type": kind, "data": data or {}}
        await self.ws.send(orjson.dumps(raw).decode())

    async def register(self, bridge_id: str = "br1", count: int = 2, **extra: Any) -> None:
        data = {"bridgeId": bridge_id, "instanceCount": count, "availableInstanceCount": count}
        await self.send("REGISTER", data | extra)

    async def next(self, timeout: float = 5.0) -> dict[str, Any]:
        while True:
            msg: dict[str, Any] = orjson.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if msg["type"] != "PING":
                return msg

    async def ack(self, task_id: str, code: int = 0) -> None:
        await self.send("TASK_ACK", {"code": code, "msg": "ok", "data": {"taskId": task_id}})

    async def close_code(self) -> int | None:
        with pytest.raises(websockets.ConnectionClosed):
            await self.next()
        code: int | None = self.ws.close_code
        return code


#: a TASK_END failure as ``aigcq bridge`` reports ComfyUI refusing a prompt (its 400)
PROMPT_INVALID = {
    "class": "task",
    "code": "PromptValidation",
    "message": "Prompt outputs failed validation: EmptyLatentImage: width 40960 bigger than max",
}


#: a TASK_END's ``failure`` when the instance running the task died (the machine's fault)
INSTANCE_LOST = {"class": "infrastructure", "code": "InstanceLost", "message": "instance died"}


async def task_end(
    env: Env, webhook: str, code: int = 0, failure: dict[str, str] | None = None
) -> int:
    """POST a TASK_END (``code`` 0 = success; a ``failure`` is one with its class, code and
    message) to the signed URL, its host rewritten to the test server."""
    return await post_task_end(env.base, webhook, code, failure)


async def post_task_end(
    base: str, webhook: str, code: int = 0, failure: dict[str, str] | None = None
) -> int:
    """:func:`task_end` to the server at ``base`` (``http://host:port``)."""
    data: dict[str, Any] = {"code": code, "msg": "success", "data": []}
    if failure is not None:
        data |= {"code": code or 1, "msg": failure["message"], "failure": failure}
    body = {"event": "TASK_END", "taskId": "x", "eventData": orjson.dumps(data).decode()}
    async with httpx.AsyncClient() as http:
        url = f"{base}{urlsplit(webhook).path}?{urlsplit(webhook).query}"
        return (await http.post(url, json=body)).status_code


def instances_with(*models: str) -> list[dict[str, Any]]:
    """REGISTER's ``instances``: one idle instance that has these model files."""
    classes = ["CheckpointLoaderSimple", "EmptyLatentImage", "VAEDecode", "SaveImage"]
    return [
        {"instanceId": "i0", "url": "http://i0", "state": "idle", "nodeClasses": classes,
         "models": list(models)}
    ]  # fmt: skip
