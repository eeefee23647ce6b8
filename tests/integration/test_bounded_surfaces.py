"""The bounds every aigcq HTTP / WebSocket surface is served with (issue 25 item 9;
``plumbing/connection_limits.py``), on real sockets against uvicorn: silent and slowloris
connections are cut after the head timeout, an oversized head gets 431, connections over
the per-process limit get 503 (WebSocket upgrades too) while the health probe is answered,
and an idle keep-alive connection is closed. The e2e tests check each real process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import websockets
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from aigcq.plumbing.http_limits import PROBE_RESERVE, HttpLimits
from tests.fakes import loris
from tests.fakes.servers import Served, serve_killable
from tests.fakes.waiting import wait_until

LIMIT = 8


async def _ok(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def _echo(ws: WebSocket) -> None:
    await ws.accept()
    await ws.send_text(await ws.receive_text())
    await ws.close()


APP = Starlette(routes=[Route("/", _ok), Route("/healthz", _ok), WebSocketRoute("/ws", _echo)])


@dataclass
class Bounded:
    port: int
    served: Served

    async def holding(self, count: int) -> None:
        """Until the server has accepted ``count`` connections."""
        connections = self.served.server.server_state.connections
        await wait_until(lambda: len(connections) >= count, 10, what=f"{count} accepted")


async def _served(limits: HttpLimits) -> AsyncIterator[Bounded]:
    async with serve_killable(APP, limits=limits) as served:
        yield Bounded(int(served.url.rsplit(":", 1)[1]), served)


@pytest.fixture
async def quick() -> AsyncIterator[int]:
    """A server whose heads must arrive within 0.5 s."""
    async for bounded in _served(HttpLimits(http_header_timeout_s=0.5, http_keepalive_s=1)):
        yield bounded.port


@pytest.fixture
async def small() -> AsyncIterator[Bounded]:
    """A server of :data:`LIMIT` connections (heads may take a minute)."""
    async for bounded in _served(HttpLimits(http_header_timeout_s=60, max_connections=LIMIT)):
        yield bounded


async def test_a_silent_connection_is_closed_after_the_head_timeout(quick: int) -> None:
    sock = await asyncio.to_thread(loris.connect, quick)
    with sock:
        assert await asyncio.to_thread(loris.closed_by_server, sock) == b""  # closed, no answer


async def test_a_slowloris_head_is_cut_with_408(quick: int) -> None:
    """600 header lines 0.1 s apart would take a minute: the server stops it at 0.5 s."""
    answer = await asyncio.to_thread(loris.slowloris, quick)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408 ")
    assert b"AIGCQ_HTTP_HEADER_TIMEOUT_S=0.5" in answer


async def test_an_idle_keep_alive_connection_is_closed(quick: int) -> None:
    def one_request_then_idle() -> bytes | None:
        with loris.connect(quick) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            return loris.closed_by_server(sock)

    answer = await asyncio.to_thread(one_request_then_idle)
    assert answer is not None and answer.startswith(b"HTTP/1.1 200 ")  # then closed


async def test_an_oversized_head_gets_431(quick: int) -> None:
    status, answer = await asyncio.to_thread(
        loris.request, quick, "/", b"X-Big: " + b"a" * 40_000 + b"\r\n"
    )
    assert status == 431 and b"AIGCQ_HTTP_MAX_HEADER_BYTES" in answer
    assert (await asyncio.to_thread(loris.request, quick, "/"))[0] == 200


async def test_connections_over_the_limit_get_503_but_the_probe_is_answered(
    small: Bounded,
) -> None:
    port = small.port
    with loris.held(port, LIMIT):
        await small.holding(LIMIT)
        status, answer = await asyncio.to_thread(loris.request, port, "/")
        assert status == 503 and b"retry-after: 1" in answer.lower()
        assert b"AIGCQ_MAX_CONNECTIONS=8 per process" in answer
        assert (await asyncio.to_thread(loris.request, port, "/healthz"))[0] == 200
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(f"ws://127.0.0.1:{port}/ws")
        assert refused.value.response.status_code == 503
    assert (await asyncio.to_thread(loris.request, port, "/"))[0] == 200  # room again
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
        await ws.send("hi")
        assert await ws.recv() == "hi"


async def test_far_over_the_limit_a_connection_is_refused_at_once(small: Bounded) -> None:
    """Beyond the probes' reserve the server answers before reading a byte."""
    with loris.held(small.port, LIMIT + PROBE_RESERVE):
        await small.holding(LIMIT + PROBE_RESERVE)
        sock = await asyncio.to_thread(loris.connect, small.port)
        with sock:
            answer = await asyncio.to_thread(loris.closed_by_server, sock)
    assert answer is not None and answer.startswith(b"HTTP/1.1 503 ")


def test_the_limit_stays_below_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    assert HttpLimits(max_connections=4096).connection_limit() == 1024 - 256 - PROBE_RESERVE
    assert HttpLimits(max_connections=100).connection_limit() == 100
