"""Reusable test helpers: serve an ASGI app on a free port, record incoming requests,
perform a platform adapter's request, wait for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import orjson
import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from aigcq.platforms.base import HttpRequest

T = TypeVar("T")


@contextlib.asynccontextmanager
async def serve_app(app: ASGIApp, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Run ``app`` with uvicorn (lifespan included) in this event loop on a free port.

    ``async with serve_app(app) as base_url:`` yields ``http://127.0.0.1:<port>`` once the
    server accepts connections, and shuts it down on exit.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # start-up failed: raise its error
                raise RuntimeError("server stopped during start-up")
            await asyncio.sleep(0.005)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


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
        failing = len(self.received) <= self.fail_first
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


async def until(
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    within: float = 5.0,
    interval: float = 0.02,
) -> T:
    """Call ``probe`` until ``done(result)``; return that result, or fail after ``within`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not done(result := await probe()):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s; last: {result!r}")
        await asyncio.sleep(interval)
    return result


@dataclass
class ServiceStack:
    """An in-process ``aigcq serve`` and the RunningHub emulator it overflows to."""

    base: str  # http://127.0.0.1:<port> of the service
    rh: str  # base URL of the emulator
    service: Any  # aigcq.serve.server.ServeProcess

    @property
    def ws_url(self) -> str:
        return self.base.replace("http", "ws", 1) + "/"

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])


@contextlib.asynccontextmanager
async def service_with_runninghub(
    config_dir: Any,
    redis: Any,
    redis_url: str,
    *,
    models: str,
    emulator: Any,
    token: str,
    **settings: Any,
) -> AsyncIterator[ServiceStack]:
    """``models`` is model.json's text; webhooks come back to the service unless
    ``callback_url`` is given."""
    from aigcq.config import PlatformConfig, Settings
    from aigcq.emulators.runninghub import create_app
    from aigcq.serve.server import ServeProcess

    (config_dir / "model.json").write_text(models)
    async with serve_app(create_app(emulator)) as rh:
        s = Settings(
            redis_url=redis_url,
            token_secret="t" * 32,
            client_tokens=[token],
            config_dir=config_dir,
            runninghub_url=rh,
            sweep_interval_s=0.1,
            **settings,
        )
        service = ServeProcess(s, PlatformConfig.load(config_dir), redis)
        async with serve_app(service.app) as base:
            if "callback_url" not in settings:
                s.callback_url = base
            yield ServiceStack(base, rh, service)


#: keys background loops rewrite on their own schedule (health state, free bridge slots
#: per process, the loops' leases, which expire): not part of what a refused request must
#: leave unchanged
BACKGROUND_KEYS = re.compile(r"^md:state:|:internal:free$|:lock:")


async def redis_snapshot(redis: aioredis.Redis) -> dict[str, tuple[str, Any]]:
    """Every key with its type and whole content: what 'changes nothing' is checked
    against (sizes alone would miss a field rewritten in place, a task's status say)."""
    read = {
        "hash": redis.hgetall,
        "list": lambda k: redis.lrange(k, 0, -1),
        "zset": lambda k: redis.zrange(k, 0, -1, withscores=True),
        "set": lambda k: _sorted(redis.smembers(k)),
        "string": redis.get,
        "stream": lambda k: redis.xrange(k),
    }
    out: dict[str, tuple[str, Any]] = {}
    for key in await redis.keys("*"):
        if BACKGROUND_KEYS.search(str(key)):
            continue
        kind = str(await redis.type(key))
        content = read.get(kind)
        out[str(key)] = (kind, await content(key) if content else None)
    return out


async def _sorted(members: Awaitable[set[Any]]) -> list[Any]:
    return sorted(await members)


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
