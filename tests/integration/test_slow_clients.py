"""Issue 15 item 7: a client that stops reading holds up nobody, not even its own reconnect.

Two service processes (in-process, one Redis). A client connects, stops reading (a tiny
receive buffer, reading paused) and gets megabytes of results: the server's sends to it
block. It then connects again, and another client's result is produced meanwhile. Its
old socket is closed in the background, within AIGCQ_CLIENT_SEND_TIMEOUT_S, so the new
connection and the other client are served at once (before, each waited on the stalled
socket's close for the server's 10 s close timeout).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.auth import issue_client_token
from aigcq.plumbing.signing import webhook_url
from aigcq.serve.server import ServeProcess
from tests.fakes.client import Client
from tests.fakes.servers import serve_app

SECRET = "slow-client-secret-with-32-bytes-at-least"
RESULTS = 24  # x 256 KiB: more than the kernel buffers on both sides hold (4 MB here)
WITHIN = 6.0  # liveness bound, well under the 10 s the stalled close used to take


@pytest.fixture
async def two_processes(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> AsyncIterator[tuple[str, str]]:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')

    def service() -> ServeProcess:
        settings = Settings(
            redis_url=redis_url,
            token_secret=SECRET,
            config_dir=tmp_path,
            client_send_timeout_s=0.5,
            sweep_interval_s=60.0,  # no delivery sweep to hide a stalled event bus
        )
        return ServeProcess(settings, PlatformConfig.load(tmp_path), redis)

    async with serve_app(service().app) as one, serve_app(service().app) as two:
        yield one, two


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def _stalled_client(
    base: str, backend_id: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that opens the WebSocket and then never reads again (a tiny receive
    buffer, so the server's sends back up after a few megabytes)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", _port(base)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    query = urlencode({"token": issue_client_token(SECRET, backend_id), "id": backend_id})
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert b" 101 " in await reader.readline()
    await reader.readuntil(b"\r\n\r\n")
    writer.transport.pause_reading()
    return reader, writer


async def _submit(http: httpx.AsyncClient, base: str, backend_id: str, task_id: str) -> None:
    body = {"taskId": task_id, "platform": "comfyui", "AIGC": "proj", "payload": {}}
    headers = {"Authorization": f"Bearer {issue_client_token(SECRET, backend_id)}"}
    assert (await http.post(f"{base}/api/tasks", json=body, headers=headers)).status_code == 202


async def _finish(http: httpx.AsyncClient, base: str, task_id: str, size: int = 16) -> None:
    output = {"fileUrl": "x" * size, "fileType": "png", "nodeId": "9"}
    event = {"code": 0, "msg": "success", "data": [output]}
    body = {"event": "TASK_END", "eventData": orjson.dumps(event).decode()}
    resp = await http.post(webhook_url(base, SECRET.encode(), task_id, 0), json=body)
    assert resp.status_code == 200, resp.text


async def _flood(http: httpx.AsyncClient, base: str, backend_id: str) -> None:
    for i in range(RESULTS):
        await _submit(http, base, backend_id, f"{backend_id}-{i}")
        await _finish(http, base, f"{backend_id}-{i}", size=256 << 10)


async def test_a_stalled_client_delays_no_other_clients_results(
    two_processes: tuple[str, str],
) -> None:
    one, two = two_processes
    _, stalled = await _stalled_client(one, "slow")
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            other = await Client(_port(one), "fast", issue_client_token(SECRET, "fast")).connect()
            await _submit(http, two, "fast", "fast-1")
            await _flood(http, two, "slow")
            # "slow" connects to the other process: the first closes its stalled socket
            again = await Client(_port(two), "slow", issue_client_token(SECRET, "slow")).connect()
            await _finish(http, two, "fast-1")
            result = await other.next(timeout=WITHIN)
            assert result["type"] == "result" and result["taskId"] == "fast-1"
            await again.close()
            await other.close()
    finally:
        stalled.transport.abort()  # else a server still waiting on it never shuts down


async def test_a_stalled_client_reconnects_at_once(two_processes: tuple[str, str]) -> None:
    one, _two = two_processes
    stalled_reader, stalled = await _stalled_client(one, "slow")
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            await _flood(http, one, "slow")
            again = await Client(_port(one), "slow", issue_client_token(SECRET, "slow")).connect()
            await again.send({"type": "ping"})
            while (reply := await again.next(timeout=WITHIN))["type"] == "result":
                pass
            assert reply["type"] == "pong"
            await again.close()
        # The server dropped the stalled socket (not only stopped writing to it): what it
        # had sent drains to the end of the stream.
        stalled.transport.resume_reading()
        with contextlib.suppress(ConnectionError):
            while await asyncio.wait_for(stalled_reader.read(1 << 16), WITHIN):
                pass
    finally:
        stalled.transport.abort()
