"""The bridge's own HTTP server (``agent/http_server.py``, h11 on asyncio) serving its
routes (``agent/web.py``), on real sockets: the bounds of ``HttpLimits`` as the server's
uvicorn surfaces apply them (silent and slowloris connections cut after the head timeout,
an oversized head 431, 503 over the connection limit with the probe answered, an idle
keep-alive connection closed, a large body 413), a malformed request 400 with the server
serving on, keep-alive, and what each route answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aigcq.agent.http_server import HttpServer
from aigcq.agent.web import FILES, bridge_routes
from aigcq.plumbing.http_limits import PROBE_RESERVE, HttpLimits
from aigcq.wire.links import signed_url
from tests.fakes import loris
from tests.fakes.waiting import wait_until

LIMIT = 8
TOKEN = "bridge-admin-token"


class _Control:
    """The bridge's side of its routes: a status, a files folder, recorded address changes."""

    token = TOKEN
    file_key = b"k" * 32

    def __init__(self, files_dir: Path) -> None:
        self.files_dir = files_dir
        self.servers: list[str] = []

    def status(self) -> dict[str, Any]:
        return {
            "bridgeId": "b-1",
            "server": "ws://hub/ws",
            "connection": {"state": "connected", "lastError": ""},
            "instances": [],
            "tasks": [],
            "spooled": [],
        }

    async def set_server(self, url: str) -> None:
        self.servers.append(url)


class Served:
    def __init__(self, server: HttpServer, port: int, control: _Control) -> None:
        self.server, self.port, self.control = server, port, control
        self.url = f"http://127.0.0.1:{port}"

    async def holding(self, count: int) -> None:
        """Until the server has accepted ``count`` connections."""
        connections = self.server.connections
        await wait_until(lambda: len(connections) >= count, 10, what=f"{count} accepted")


async def _served(limits: HttpLimits, tmp_path: Path) -> AsyncIterator[Served]:
    control = _Control(tmp_path)
    server = HttpServer(bridge_routes(control), limits, "bridge test")
    port = await server.start("127.0.0.1", 0)
    try:
        yield Served(server, port, control)
    finally:
        await server.close()


@pytest.fixture
async def quick(tmp_path: Path) -> AsyncIterator[Served]:
    """Heads must arrive within 0.5 s; an idle keep-alive connection goes after 1 s."""
    limits = HttpLimits(http_header_timeout_s=0.5, http_keepalive_s=1)
    async for served in _served(limits, tmp_path):
        yield served


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Served]:
    """:data:`LIMIT` connections (heads may take a minute)."""
    limits = HttpLimits(http_header_timeout_s=60, max_connections=LIMIT)
    async for served in _served(limits, tmp_path):
        yield served


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection: all the server sent before closing it."""
    with loris.connect(port) as sock:
        sock.sendall(data)
        return loris.closed_by_server(sock) or b""


# ---- the bounds -------------------------------------------------------------------------


async def test_a_silent_connection_is_closed_after_the_head_timeout(quick: Served) -> None:
    sock = await asyncio.to_thread(loris.connect, quick.port)
    started = time.monotonic()
    with sock:
        assert await asyncio.to_thread(loris.closed_by_server, sock) == b""  # no answer
    assert 0.4 < time.monotonic() - started < 5


async def test_a_slowloris_head_is_cut_with_408(quick: Served) -> None:
    answer = await asyncio.to_thread(loris.slowloris, quick.port)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408 ")
    assert b"AIGCQ_HTTP_HEADER_TIMEOUT_S=0.5" in answer


async def test_an_oversized_head_gets_431_and_the_server_serves_on(quick: Served) -> None:
    status, answer = await asyncio.to_thread(
        loris.request, quick.port, "/healthz", b"X-Big: " + b"a" * 40_000 + b"\r\n"
    )
    assert status == 431 and b"AIGCQ_HTTP_MAX_HEADER_BYTES=32768" in answer
    assert (await asyncio.to_thread(loris.request, quick.port))[0] == 200


async def test_a_malformed_request_gets_400_and_the_server_serves_on(quick: Served) -> None:
    answer = await asyncio.to_thread(_exchange, quick.port, b"NOT HTTP AT ALL\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert (await asyncio.to_thread(loris.request, quick.port))[0] == 200


async def test_connections_over_the_limit_get_503_but_the_probe_is_answered(
    small: Served,
) -> None:
    with loris.held(small.port, LIMIT):
        await small.holding(LIMIT)
        status, answer = await asyncio.to_thread(loris.request, small.port, "/api/status")
        assert status == 503 and b"retry-after: 1" in answer.lower()
        assert f"AIGCQ_MAX_CONNECTIONS={LIMIT} per process".encode() in answer
        assert (await asyncio.to_thread(loris.request, small.port, "/healthz"))[0] == 200
    await wait_until(lambda: not small.server.connections, 10, what="the held ones gone")
    assert (await asyncio.to_thread(loris.request, small.port, "/api/status"))[0] == 200


async def test_far_over_the_limit_a_connection_is_refused_at_once(small: Served) -> None:
    with loris.held(small.port, LIMIT + PROBE_RESERVE):
        await small.holding(LIMIT + PROBE_RESERVE)
        sock = await asyncio.to_thread(loris.connect, small.port)
        with sock:
            answer = await asyncio.to_thread(loris.closed_by_server, sock)
    assert answer is not None and answer.startswith(b"HTTP/1.1 503 ")


async def test_an_idle_keep_alive_connection_is_closed(quick: Served) -> None:
    """Idle 1 s (``http_keepalive_s``) after its answer, though heads must come in 0.5 s."""

    def one_request_then_idle() -> tuple[bytes, float]:
        with loris.connect(quick.port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            started = time.monotonic()
            return loris.closed_by_server(sock) or b"", time.monotonic() - started

    answer, idle = await asyncio.to_thread(one_request_then_idle)
    assert answer.startswith(b"HTTP/1.1 200 ") and 0.9 < idle < 5


async def test_two_requests_on_one_connection(quick: Served) -> None:
    """The second comes after longer than the head timeout: its timer starts at its first
    byte, not at the end of the first answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", quick.port)
    try:
        for path in (b"/healthz", b"/api/status"):
            writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), head
            length = next(
                int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )  # fmt: skip
            body = await reader.readexactly(length)
            await asyncio.sleep(0.7)
        assert b'"bridgeId":"b-1"' in body
    finally:
        writer.close()


async def test_a_body_over_16_kib_gets_413_before_the_address_changes(quick: Served) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=quick.url, headers=auth) as http:
        huge = await http.post("/api/server", json={"url": "ws://h/ws", "pad": "x" * (17 << 10)})
        assert huge.status_code == 413
        assert huge.json() == {"detail": "request body over 16384 bytes"}
        assert quick.control.servers == []
        fine = await http.post("/api/server", json={"url": "ws://h/ws"})
    assert fine.status_code == 200 and fine.json() == {"server": "ws://h/ws"}
    assert quick.control.servers == ["ws://h/ws"]


# ---- the routes -------------------------------------------------------------------------


async def test_the_routes_answer_as_before(quick: Served) -> None:
    async with httpx.AsyncClient(base_url=quick.url) as http:
        page = await http.get("/")
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert "aigcq bridge b-1" in page.text
        assert (await http.get("/api/status")).json()["bridgeId"] == "b-1"
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        missing = await http.get("/nowhere")
        assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
        wrong = await http.get("/api/server")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        unsigned = await http.get("/files/t/out.png")
        assert unsigned.status_code == 403 and unsigned.json()["code"] == "SignatureError"
        form = {"url": "ws://form/ws", "token": TOKEN}
        moved = await http.post("/api/server", data=form)
        assert moved.status_code == 303 and moved.headers["location"] == "/"
        refused = await http.post("/api/server", data={"url": "ws://x/ws", "token": "no"})
        assert refused.status_code == 401 and "AIGCQ_BRIDGE_TOKEN" in refused.json()["detail"]
        bad = await http.post("/api/server", json={"url": "http://x/"}, headers={
            "Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert bad.status_code == 400
    assert quick.control.servers == ["ws://form/ws"]


async def test_a_signed_result_file_is_served_whole_and_inline(
    quick: Served, tmp_path: Path
) -> None:
    (tmp_path / "t-1").mkdir()
    content = bytes(range(256)) * 5000  # more than one chunk read
    (tmp_path / "t-1" / "out.png").write_bytes(content)
    url = signed_url(quick.url, quick.control.file_key, "t-1/out.png", int(time.time()) + 60, FILES)
    async with httpx.AsyncClient() as http:
        got = await http.get(url)
        gone = await http.get(url.replace("out.png", "other.png"))
    assert got.status_code == 200 and got.content == content
    assert got.headers["content-type"] == "image/png"
    assert got.headers["content-length"] == str(len(content))
    assert got.headers["content-disposition"] == 'inline; filename="out.png"'
    assert gone.status_code == 403  # signed for out.png only
    assert got.headers["accept-ranges"] == "bytes"


async def test_a_result_file_s_byte_range_is_served_alone(quick: Served, tmp_path: Path) -> None:
    """Comfy API v2's asset download asks the bridge for a byte range (Range): 206 with
    that range, the last bytes with ``-n``, 416 past the end."""
    (tmp_path / "t-2").mkdir()
    content = bytes(range(256)) * 8000  # two file chunks and more
    (tmp_path / "t-2" / "out.png").write_bytes(content)
    url = signed_url(quick.url, quick.control.file_key, "t-2/out.png", int(time.time()) + 60, FILES)
    size = len(content)
    async with httpx.AsyncClient() as http:
        head = await http.get(url, headers={"Range": "bytes=0-7"})
        middle = await http.get(url, headers={"Range": f"bytes=1048570-{size + 10}"})
        tail = await http.get(url, headers={"Range": "bytes=-5"})
        past = await http.get(url, headers={"Range": f"bytes={size}-"})
        several = await http.get(url, headers={"Range": "bytes=0-1,4-5"})
    assert (head.status_code, head.content) == (206, content[:8])
    assert head.headers["content-range"] == f"bytes 0-7/{size}"
    assert (middle.status_code, middle.content) == (206, content[1048570:])
    assert (tail.status_code, tail.content) == (206, content[-5:])
    assert (past.status_code, past.headers["content-range"]) == (416, f"bytes */{size}")
    assert (several.status_code, several.content) == (200, content)  # served whole
