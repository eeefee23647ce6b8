"""The CLI's submit: one task over the client WebSocket, with a live status line."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import orjson
import websockets
from rich.console import Console


async def submit_and_wait(
    server: str,
    token: str,
    backend_id: str,
    message: dict[str, Any],
    timeout: float,
    console: Console,
) -> dict[str, Any]:
    url = f"{server.rstrip('/')}/?{urlencode({'token': token, 'id': backend_id})}"
    task_id = message["taskId"]
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(orjson.dumps(message).decode())
        with console.status(f"task {task_id}: submitting") as status:
            async with asyncio.timeout(timeout):
                async for raw in ws:
                    reply = orjson.loads(raw)
                    if reply.get("taskId") != task_id:
                        continue
                    if reply["type"] == "submitted":
                        status.update(f"task {task_id}: {reply.get('msg', 'queued')}")
                    elif reply["type"] == "progress":
                        status.update(f"task {task_id}: {reply.get('value')}/{reply.get('max')}")
                    elif reply["type"] in ("result", "error"):
                        result: dict[str, Any] = reply
                        return result
    return {"type": "error", "taskId": task_id, "code": "Disconnected"}
