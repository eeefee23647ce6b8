"""A business backend on the client WebSocket (``Client``) and the frames it sends."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import orjson
import websockets
from bench.processes import CLIENT_TOKEN

from tests.fakes.comfyui import E2E_GRAPH

AUTH = {"Authorization": f"Bearer {CLIENT_TOKEN}"}


class Client:
    """A business backend on the client WebSocket, counting results per taskId."""

    def __init__(self, port: int, backend_id: str, token: str = CLIENT_TOKEN) -> None:
        query = urlencode({"token": token, "id": backend_id})
        self.url = f"ws://127.0.0.1:{port}/?{query}"
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.replies: list[dict[str, Any]] = []
        #: QUEUE_UPDATE messages read and not yet asked for (:meth:`update`)
        self.updates: list[dict[str, Any]] = []
        self.ws: Any = None

    async def connect(self) -> Client:
        self.ws = await websockets.connect(self.url, max_size=None)
        return self

    async def close(self) -> None:
        await self.ws.close()

    async def resumed(
        self, restart: Callable[[], object], count: int, *, linger: float = 0.5
    ) -> Client:
        """Drop this connection, ``restart`` the server, and come back as the same backend
        with the results got so far (as a business backend keeps them); then read until
        ``count`` tasks have a result, and ``linger`` to catch duplicates."""
        await self.ws.close()
        restart()
        again = copy.copy(self)  # same URL: the same backend
        again.replies = []
        again.results = {task_id: list(msgs) for task_id, msgs in self.results.items()}
        await again.connect()
        await again.collect(count, timeout=60)
        await again.linger(linger)
        return again

    async def send(self, message: dict[str, Any] | str) -> None:
        await self.ws.send(message if isinstance(message, str) else orjson.dumps(message).decode())

    async def request(self, message: dict[str, Any] | str) -> dict[str, Any]:
        """Send and return the next non-result reply."""
        await self.send(message)
        while True:
            msg = await self.next()
            if msg["type"] != "result":
                return msg

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next message, but for ``QUEUE_UPDATE`` news (kept in :attr:`updates`)."""
        deadline = time.monotonic() + timeout
        while True:
            msg = await self._receive(deadline)
            if msg["type"] != "QUEUE_UPDATE":
                return msg

    async def update(self, task_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next ``QUEUE_UPDATE`` about ``task_id`` (other messages are kept as by
        :meth:`next`)."""
        deadline = time.monotonic() + timeout
        while not any(u["taskId"] == task_id for u in self.updates):
            await self._receive(deadline)
        found = next(u for u in self.updates if u["taskId"] == task_id)
        self.updates.remove(found)
        return found

    async def _receive(self, deadline: float) -> dict[str, Any]:
        """One message, kept with the results, the replies or the updates."""
        left = max(deadline - time.monotonic(), 0.0)
        msg: dict[str, Any] = orjson.loads(await asyncio.wait_for(self.ws.recv(), left))
        if msg["type"] == "QUEUE_UPDATE":
            self.updates.append(msg)
        elif msg["type"] == "result":
            self.results.setdefault(msg["taskId"], []).append(msg)
        else:
            self.replies.append(msg)
        return msg

    async def collect(self, count: int, timeout: float = 30.0) -> None:
        """Read until ``count`` distinct tasks have a result (or time out)."""
        deadline = time.monotonic() + timeout
        while len(self.results) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self.results)}/{count} results")
            try:
                await self.next(timeout=left)
            except (TimeoutError, websockets.ConnectionClosed):
                raise TimeoutError(f"{len(self.results)}/{count} results") from None

    async def linger(self, seconds: float) -> None:
        """Keep reading for a while to catch duplicates."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                await self.next(timeout=left)
            except TimeoutError:
                return


def generate(
    task_id: str, platform: str = "comfyui", aigc: str = "proj", **payload: Any
) -> dict[str, Any]:
    payload = payload or {"workflowId": "1904136902449209346", "nodeInfoList": []}
    return {
        "type": "generate",
        "taskId": task_id,
        "platform": platform,
        "AIGC": aigc,
        "payload": payload,
    }


def bridge_task(task_id: str, **payload: Any) -> dict[str, Any]:
    """A generate frame whose inline workflow any emulated ComfyUI runs."""
    return generate(task_id, **(payload or {"workflowId": "e2e-inline", "workflow": E2E_GRAPH}))


def exactly_once(client: Client, ids: list[str]) -> None:
    """Every one of ``ids`` got exactly one result, a success, and no other task did."""
    assert sorted(client.results) == sorted(ids)
    dupes = {k: len(v) for k, v in client.results.items() if len(v) != 1}
    assert not dupes, dupes
    failed = {k: v[0] for k, v in client.results.items() if v[0]["status"] != "success"}
    assert not failed, failed
