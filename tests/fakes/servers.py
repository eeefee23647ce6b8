"""In-process HTTP servers for tests: serve an ASGI app on a socket bound first (no race
for a free port) and kill it as a killed process goes, or a handler on the bridge's own
server (:func:`serve_handler`); record incoming requests, a port that refuses connections,
and the client side of a platform adapter's request or of a huge chunked upload."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from aigcq.agent.http_server import Handler, HttpServer
from aigcq.platforms.base import HttpRequest
from aigcq.plumbing.connection_limits import bounded_config
from aigcq.plumbing.http_limits import HttpLimits
from tests.fakes.waiting import wait_until


def bound_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to a port of its own on ``host`` (not listening yet): hand it to
    a server, which then owns the port from the start (no window for another to take it).
    ``port``: that one (a server coming back where it was)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@contextlib.contextmanager
def closed_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port on ``host`` that refuses connections: bound, never listening, so no other
    program can take it while the test relies on nothing answering there."""
    with bound_socket(host) as sock:
        yield sock.getsockname()[1]


@dataclass(eq=False)
class Served:
    """A running :func:`serve_killable` server: its ``url``, and :meth:`kill`."""

    url: str
    server: uvicorn.Server

    def kill(self) -> None:
        """Gone as a killed process is: the port refuses connections and every open one
        (HTTP keep-alive, WebSocket) is reset, with no closing handshake."""
        for listener in self.server.servers:
            listener.close()
        for connection in list(self.server.server_state.connections):
            connection.transport.abort()


@contextlib.asynccontextmanager
async def serve_killable(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0, limits: HttpLimits | None = None
) -> AsyncIterator[Served]:
    """As :func:`serve_app`, yielding a :class:`Served` whose :meth:`~Served.kill` takes the
    server away abruptly (the app's lifespan still ends on exit); on ``port`` if given;
    with ``limits``, bounded as aigcq's own servers are."""
    sock = bound_socket(host, port)
    port = sock.getsockname()[1]
    options: dict[str, Any] = {"log_config": None, "access_log": False, "lifespan": "on"}
    if limits is None:
        config = uvicorn.Config(app, **options)
    else:
        config = bounded_config(app, limits, **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or task.done(), 60, 0.005, what="uvicorn start-up")
        if not server.started:
            task.result()  # start-up failed: raise its error
            raise RuntimeError("server stopped during start-up")
        yield Served(f"http://{host}:{port}", server)
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def serve_app(
    app: ASGIApp, host: str = "127.0.0.1", limits: HttpLimits | None = None
) -> AsyncIterator[str]:
    """Run ``app`` with uvicorn (lifespan included) in this event loop on its own socket.

    ``async with serve_app(app) as base_url:`` yields ``http://127.0.0.1:<port>`` once the
    server accepts connections, and shuts it down on exit.
    """
    async with serve_killable(app, host, limits=limits) as served:
        yield served.url


@contextlib.asynccontextmanager
async def serve_handler(
    handler: Handler, limits: HttpLimits | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[str]:
    """Run ``handler`` on the bridge's HTTP server (:mod:`aigcq.agent.http_server`) on a
    port of its own: yields ``http://host:<port>``, and closes it on exit."""
    server = HttpServer(handler, limits or HttpLimits())
    port = await server.start(host, 0)
    try:
        yield f"http://{host}:{port}"
    finally:
        await server.close()


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class Recorder:
    """An app that records every request (any path) and answers 200 — or ``fail_status``
    for the first ``fail_first`` requests. Serve ``recorder.app`` with :func:`serve_app`."""

    def __init__(self, fail_first: int = 0, fail_status: int = 500) -> None:
        self.received: list[Received] = []
        self.fail_first = fail_first
        self.fail_status = fail_status
        #: requests with one of these query strings always get ``fail_status`` (a hub that
        #: no longer takes an attempt's webhook URL)
        self.refused_queries: set[str] = set()
        self._changed = asyncio.Condition()
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        self.app = Starlette(routes=[Route("/{path:path}", self._handle, methods=methods)])

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        item = Received(
            request.method, request.url.path, request.url.query, dict(request.headers), body
        )
        async with self._changed:
            self.received.append(item)
            self._changed.notify_all()
        failing = len(self.received) <= self.fail_first or item.query in self.refused_queries
        return Response(status_code=self.fail_status if failing else 200)

    async def wait_for(self, count: int, within: float = 5.0) -> list[Received]:
        """Wait until at least ``count`` requests arrived; return all received so far."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.received) >= count), within
            )
        return list(self.received)


async def send(client: httpx.AsyncClient, request: HttpRequest) -> tuple[int, Any]:
    """Perform an adapter's request; return the status and the JSON body (else the text)."""
    response = await client.request(
        request.method, request.url, headers=request.headers, json=request.json
    )
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


@dataclass(frozen=True)
class StreamedUpload:
    status: int  # the answer's status (0: none came)
    sent: int  # body bytes written before the answer came (or the server hung up)


async def stream_until_answered(
    base_url: str, method: str, target: str, headers: dict[str, str], total: int
) -> StreamedUpload:
    """Send a chunked body of up to ``total`` bytes to ``base_url`` + ``target``, stopping as
    soon as an answer arrives: what a server that refuses before reading it all lets through."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    writer.write(head.encode())
    answer = asyncio.create_task(reader.readline())
    chunk = b"%x\r\n" % (64 << 10) + b"[" * (64 << 10) + b"\r\n"
    sent = 0
    with contextlib.suppress(ConnectionError):  # the server hung up after answering
        while sent < total and not answer.done():
            writer.write(chunk)
            await writer.drain()
            sent += 64 << 10
        writer.write(b"0\r\n\r\n")
    try:
        status_line = await asyncio.wait_for(answer, 30)
    except (ConnectionError, TimeoutError):
        status_line = b""
    finally:
        writer.close()
    parts = status_line.split()
    return StreamedUpload(int(parts[1]) if len(parts) > 1 else 0, sent)
