"""An HTTP model service for tests and demos (``aigcq emulate model-service``).

Any path answers GET (payload in the query) and POST (JSON payload) after ``latency`` seconds,
failing with HTTP 500 at ``failure_rate``. It replies ``json`` (an object echoing the payload
and headers), ``text`` or ``image`` (a PNG). A payload may override per call with ``_latency``,
``_fail`` and ``_response``. Failure modes (as ``_response`` or ``response``):

* ``drip`` — 200, then one byte every ``_dripSeconds`` (0.5) until ``_dripBytes`` (30) are sent;
* ``oversize`` — 200 with ``_size`` bytes (30 MiB) of JSON, chunked when ``_chunked`` is true;
* ``garbage`` — 200, ``application/json``, a body that is not JSON;
* ``empty`` — 200, ``application/json``, no body.

The model service being down is a closed port (stop the emulator). It records its current
and peak concurrency, its call count and the calls per ``X-Asynch-Task-Id``:

* ``GET /_emulator/stats`` → ``{calls, current, peak, failures, byTask}``
* ``POST /_emulator/config`` ``{latency?, failureRate?, response?}`` — change the behaviour
* ``POST /_emulator/reset`` — zero the counters
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from aigcq.emulators._http import read_json, reply, serve_app
from aigcq.emulators.png import tiny_png

Kind = Literal["json", "text", "image", "drip", "oversize", "garbage", "empty"]


@dataclass
class ModelBehaviour:
    latency: float = 0.0
    failure_rate: float = 0.0
    response: Kind = "json"


@dataclass
class ModelStats:
    calls: int = 0
    current: int = 0
    peak: int = 0
    failures: int = 0
    by_task: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "current": self.current,
            "peak": self.peak,
            "failures": self.failures,
            "byTask": dict(self.by_task),
        }


def create_app(behaviour: ModelBehaviour | None = None) -> FastAPI:
    app = FastAPI(title="model-service emulator")
    app.state.behaviour = behaviour or ModelBehaviour()
    app.state.stats = ModelStats()

    @app.get("/_emulator/stats")
    async def stats(request: Request) -> Response:
        return reply(app.state.stats.as_dict())

    @app.post("/_emulator/config")
    async def configure(request: Request) -> Response:
        body = await read_json(request) or {}
        b: ModelBehaviour = app.state.behaviour
        b.latency = float(body.get("latency", b.latency))
        b.failure_rate = float(body.get("failureRate", b.failure_rate))
        b.response = body.get("response", b.response)
        return reply({"latency": b.latency, "failureRate": b.failure_rate, "response": b.response})

    @app.post("/_emulator/reset")
    async def reset(request: Request) -> Response:
        app.state.stats = ModelStats()
        return reply({"ok": True})

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def generate(request: Request, path: str) -> Response:
        payload = await _payload(request)
        stats: ModelStats = app.state.stats
        stats.calls += 1
        stats.by_task[request.headers.get("x-asynch-task-id", "")] += 1
        stats.current += 1
        stats.peak = max(stats.peak, stats.current)
        try:
            return await _answer(app.state.behaviour, stats, request, path, payload)
        finally:
            stats.current -= 1

    return app


async def _payload(request: Request) -> dict[str, Any]:
    if request.method == "GET":
        return dict(request.query_params)
    body = await read_json(request)
    return body if isinstance(body, dict) else {"payload": body}


async def _answer(
    b: ModelBehaviour, stats: ModelStats, request: Request, path: str, payload: dict[str, Any]
) -> Response:
    await _work(request, float(payload.get("_latency", b.latency)))
    fail = payload.get("_fail")
    if fail in (True, "true", "1", 1) or (fail is None and random.random() < b.failure_rate):
        stats.failures += 1
        return reply({"error": "emulated failure"}, 500)
    kind = payload.get("_response", b.response)
    if kind in ("drip", "oversize", "garbage", "empty"):
        return _faulty(kind, payload)
    if kind == "image":
        return Response(tiny_png((40, 120, 200)), media_type="image/png")
    if kind == "text":
        return Response(f"generated text for /{path}", media_type="text/plain; charset=utf-8")
    body = {"path": f"/{path}", "echo": payload, "headers": dict(request.headers)}
    return Response(orjson.dumps(body), media_type="application/json")


def _faulty(kind: str, payload: dict[str, Any]) -> Response:
    """The failure modes: a slow drip, an oversized reply, garbage, an empty body."""
    if kind == "garbage":
        return Response(b'{"result": "cut off', media_type="application/json")
    if kind == "empty":
        return Response(b"", media_type="application/json")
    if kind == "drip":
        pause = float(payload.get("_dripSeconds", 0.5))
        count = int(payload.get("_dripBytes", 30))

        async def drip() -> AsyncIterator[bytes]:
            for _ in range(count):
                yield b" "
                await asyncio.sleep(pause)

        return StreamingResponse(drip(), media_type="text/plain")
    size = int(payload.get("_size", 30 << 20))
    body = b'"' + b"x" * max(size - 2, 0) + b'"'
    if str(payload.get("_chunked", "")).lower() in ("true", "1"):

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(body), 1 << 16):
                yield body[i : i + (1 << 16)]

        return StreamingResponse(chunks(), media_type="application/json")
    return Response(body, media_type="application/json")


async def _work(request: Request, seconds: float) -> None:
    """Sleep ``seconds``, stopping early when the caller has gone away (e.g. was killed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(left, 0.1))
        if await request.is_disconnected():
            return


def run(host: str, port: int, behaviour: ModelBehaviour) -> None:
    asyncio.run(serve_app(create_app(behaviour), host, port))
