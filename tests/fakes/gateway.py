"""The secret the gateway tests' services sign client tokens with, such a token, and a serve
process on a real Redis whose tasks wait (its platform's concurrency is 0)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.client import Client
from tests.fakes.servers import serve_app

SECRET = "gw-secret-with-at-least-32-bytes-of-key"
#: a static client token (AIGCQ_CLIENT_TOKENS) of :func:`serve`; its admin token is "admin"
STATIC = "static-client-token"


def token(backend_id: str = "b1") -> str:
    return issue_client_token(SECRET, backend_id)


@dataclass
class Server:
    port: int
    redis: aioredis.Redis

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def client(self, backend_id: str = "b1") -> Client:
        return await Client(self.port, backend_id, token(backend_id)).connect()


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, **overrides: Any
) -> AsyncIterator[Server]:
    """Serve over HTTP on 127.0.0.1, with project ``proj``'s comfyui at concurrency 0."""
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        admin_token="admin",
        client_tokens=[STATIC],
        **overrides,
    )
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    async with serve_app(service.app) as base:
        yield Server(int(base.rsplit(":", 1)[1]), redis)
