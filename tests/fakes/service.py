"""``aigcq serve`` in-process on a real Redis: the hub fixture (``env``), and serve with
the RunningHub emulator it overflows to."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.bridges.hub import HubConfig
from aigcq.config import PlatformConfig, Settings
from aigcq.domain import Task
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge
from tests.fakes.client import Client
from tests.fakes.servers import serve_app

#: the token secret of the ``env`` service (client tokens are signed with it)
SECRET = "hub-secret-with-at-least-32-bytes-of-key"


@dataclass
class Env:
    """A running service, its Redis, and the sockets a test opened on it."""

    port: int
    redis: aioredis.Redis
    service: ServeProcess
    sockets: list[Any] = field(default_factory=list)  # closed at teardown, even on failure

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def client(self) -> Client:
        client = await Client(self.port, "b1", issue_client_token(SECRET, "b1")).connect()
        self.sockets.append(client.ws)
        return client

    async def bridge(self, token: str | None = BRIDGE_TOKEN) -> Bridge:
        bridge = await Bridge.connect(self.port, token)
        self.sockets.append(bridge.ws)
        return bridge

    async def task(self, task_id: str) -> Task:
        task = await self.service.rt.store.reads.get(task_id)
        assert task is not None
        return task


@pytest.fixture
async def env(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Env]:
    """Serve with the bridge hub (a 1 s ACK timeout) and no paid capacity."""
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        bridge_token=BRIDGE_TOKEN,
    )
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    assert service.hub is not None
    service.hub.config = HubConfig(ack_timeout_s=1.0)
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        yield env
        for ws in env.sockets:
            await ws.close()


#: the admin token of the ``admin_env`` service
ADMIN = "admin-token"
#: one project whose queue has no paid capacity
NO_PAID = '{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}'


@pytest.fixture
async def admin_env(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Env]:
    """Serve with the bridge hub, the admin token :data:`ADMIN`, and no paid capacity."""
    async with admin_service(tmp_path, redis, redis_url) as env:
        yield env


@contextlib.asynccontextmanager
async def admin_service(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, models: str = NO_PAID
) -> AsyncIterator[Env]:
    """:func:`admin_env` with other ``model.json`` contents."""
    (tmp_path / "model.json").write_text(models)
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        bridge_token=BRIDGE_TOKEN,
        admin_token=ADMIN,
    )
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        yield env
        for ws in env.sockets:
            await ws.close()


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
    (config_dir / "model.json").write_text(models)
    async with serve_app(create_app(emulator)) as rh:
        s = Settings(
            redis_url=redis_url,
            token_secret="t" * 32,
            client_tokens=[token],
            config_dir=config_dir,
            data_dir=config_dir / "data",
            runninghub_url=rh,
            sweep_interval_s=0.1,
            **settings,
        )
        service = ServeProcess(s, PlatformConfig.load(config_dir), redis)
        async with serve_app(service.app) as base:
            if "callback_url" not in settings:
                s.callback_url = base
            yield ServiceStack(base, rh, service)


#: the client token of :func:`stack_factory`'s service
STACK_TOKEN = "deadline-client-token"

Stack = Callable[..., AbstractAsyncContextManager[tuple[Client, str]]]


async def emulator_stats(base: str) -> dict[str, Any]:
    """``/_emulator/stats`` of the emulator at ``base``."""
    async with httpx.AsyncClient() as http:
        stats: dict[str, Any] = (await http.get(f"{base}/_emulator/stats")).json()
        return stats


def stack_factory(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> Stack:
    """``stack(emulator, **settings)``: serve on RunningHub (concurrency 5, 2 attempts) and a
    connected client; yields ``(client, the emulator's base URL)``."""

    @contextlib.asynccontextmanager
    async def stack(
        emulator: RunningHubEmulatorConfig, **settings: Any
    ) -> AsyncIterator[tuple[Client, str]]:
        models = '{"proj": {"comfyui": {"apikey": "k", "concurrency": 5, "max_attempts": 2}}}'
        async with service_with_runninghub(
            tmp_path,
            redis,
            redis_url,
            models=models,
            emulator=emulator,
            token=STACK_TOKEN,
            **settings,
        ) as env:
            client = await Client(env.port, "b1", STACK_TOKEN).connect()
            yield client, env.rh
            await client.close()

    return stack


@dataclass
class Pair:
    """Two ``aigcq serve`` processes in-process on one Redis, both overflowing to one
    RunningHub emulator (``rh``: its base URL)."""

    a: Env
    b: Env
    rh: str

    async def paid_creates(self) -> int:
        return int((await emulator_stats(self.rh))["created"])


@contextlib.asynccontextmanager
async def serve_pair(
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    *,
    concurrency: int = 5,
    projects: tuple[str, ...] = ("proj",),
    **settings: Any,
) -> AsyncIterator[Pair]:
    """Two serve processes as :func:`env`'s (its client and bridge tokens), each with its own
    data dir, RunningHub at ``concurrency`` (long runs: a paid task stays paid) for each AIGC
    project of ``projects``, the default health interval (10 s: no periodic pass recovers
    internal capacity during a test)."""
    models = {p: {"comfyui": {"apikey": "k", "concurrency": concurrency}} for p in projects}
    (tmp_path / "model.json").write_text(json.dumps(models))
    emulator = RunningHubEmulatorConfig(duration_s=60, max_concurrent=max(concurrency, 1))
    async with contextlib.AsyncExitStack() as stack:
        rh = await stack.enter_async_context(serve_app(create_app(emulator)))
        envs = []
        for name in ("a", "b"):
            s = Settings(
                redis_url=redis_url,
                token_secret=SECRET,
                config_dir=tmp_path,
                data_dir=tmp_path / f"data-{name}",
                bridge_token=BRIDGE_TOKEN,
                runninghub_url=rh,
                sweep_interval_s=0.1,
                **settings,
            )
            service = ServeProcess(s, PlatformConfig.load(tmp_path), redis)
            base = await stack.enter_async_context(serve_app(service.app))
            s.callback_url = base
            envs.append(Env(int(base.rsplit(":", 1)[1]), redis, service))
            stack.push_async_callback(_close_sockets, envs[-1])
        yield Pair(envs[0], envs[1], rh)


async def _close_sockets(env: Env) -> None:
    for ws in env.sockets:
        await ws.close()
