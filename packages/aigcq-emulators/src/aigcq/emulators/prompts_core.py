"""prompts-core, for tests and demos (``aigcq emulate prompts-core``).

* ``POST /prompt/createPrompt`` ``{modelTypeId, modelType, promptInfo, responseJsonSchema,
  version}`` → ``{"code": 200, ...}``; ``modelTypeId`` and ``modelType`` are required.
* ``GET /_emulator/prompts`` → the prompts received.
* ``POST /_emulator/config`` ``{"fail": true}`` → answer every create with HTTP 500;
  ``{"mode": "down" | "garbage" | "ok", "delay": s}`` → 503, 200 with a body that is not JSON,
  or normally, after ``delay`` seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request, Response

from aigcq.emulators._http import read_json, reply, serve_app


def create_app() -> FastAPI:
    app = FastAPI(title="prompts-core emulator")
    prompts: list[dict[str, Any]] = []
    app.state.prompts = prompts
    app.state.fail = False
    app.state.mode = "ok"
    app.state.delay = 0.0

    @app.post("/prompt/createPrompt")
    async def create_prompt(request: Request) -> Response:
        if app.state.delay:
            await asyncio.sleep(app.state.delay)
        if app.state.mode == "down":
            return reply({"code": 503, "msg": "emulated outage"}, 503)
        if app.state.mode == "garbage":
            return Response(b"<html>gateway", media_type="application/json")
        if app.state.fail:
            return reply({"code": 500, "msg": "emulated failure"}, 500)
        body = await read_json(request)
        if not isinstance(body, dict) or not body.get("modelTypeId") or not body.get("modelType"):
            return reply({"code": 400, "msg": "modelTypeId and modelType are required"}, 400)
        prompts.append(body)
        return reply({"code": 200, "msg": "success", "data": {"id": len(prompts)}})

    @app.get("/_emulator/prompts")
    async def list_prompts() -> Response:
        return reply(prompts)

    @app.post("/_emulator/config")
    async def configure(request: Request) -> Response:
        body = await read_json(request) or {}
        app.state.fail = bool(body.get("fail", app.state.fail))
        app.state.mode = str(body.get("mode", app.state.mode))
        app.state.delay = float(body.get("delay", app.state.delay))
        return reply({"fail": app.state.fail, "mode": app.state.mode, "delay": app.state.delay})

    return app


def run(host: str, port: int) -> None:
    asyncio.run(serve_app(create_app(), host, port))
