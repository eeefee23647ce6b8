"""The HTTP plumbing every emulator uses: JSON replies and bodies, serving with uvicorn."""

from __future__ import annotations

from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response


def reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


async def read_json(request: Request) -> Any:
    """The request's JSON body, or None when it is not valid JSON."""
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return None


def _server(app: FastAPI, host: str, port: int) -> uvicorn.Server:
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False)
    return uvicorn.Server(config)


async def serve_app(app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` with uvicorn in the running loop until stopped; logging is the caller's."""
    await _server(app, host, port).serve()


def run_app(app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` until interrupted, on uvicorn's fastest loop (uvloop when installed)."""
    _server(app, host, port).run()
