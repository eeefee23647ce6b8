"""The message-dispatcher (``aigcq dispatcher``) in-process on a real Redis (the ``md``
fixture), ``aigcq serve`` using it as its internal target (``serve_split``), and what a
bridge behind it sends back (``md_task_end``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.bridges.hub import HubConfig
from aigcq.config import PlatformConfig, Settings
from aigcq.dispatcher.capacity import FeedConfig
from aigcq.dispatcher.process import MessageDispatcher, core_settings
from aigcq.dispatcher.settings import DispatcherSettings
from aigcq.domain import Task
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from aigcq.mdclient.target import internal_target
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge
from tests.fakes.client import Client
from tests.fakes.servers import serve_app

PASSWORD = "md-test-password"
JWT_SECRET = "md-jwt-secret-with-at-least-32-bytes-of-key"
BODY: dict[str, Any] = {
    "workflowId": "1904136902449209346",
    "nodeInfoList": [{"nodeId": "6", "fieldName": "text", "fieldValue": "a cat"}],
}


LOGIN = {"username": "admin", "password": PASSWORD}


@dataclass
class Md:
    """A running message-dispatcher: its base URL, an HTTP client on it, its Redis."""

    base: str
    http: httpx.AsyncClient
    redis: aioredis.Redis
    dispatcher: MessageDispatcher

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    async def token(self) -> str:
        resp = await self.http.post("/api/auth/login", json=LOGIN)
        token: str = resp.json()["data"]["access_token"]
        return token

    async def task(self, task_id: str) -> Task | None:
        return await self.dispatcher.service.rt.store.reads.get(task_id)


@pytest.fixture
async def md(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Md]:
    """The message-dispatcher with its bridge hub (a 2 s ACK timeout), served over HTTP."""
    md_settings = DispatcherSettings(password=PASSWORD, jwt_secret=JWT_SECRET)
    base = Settings(
        redis_url=redis_url,
        token_secret="t" * 40,
        bridge_token=BRIDGE_TOKEN,
        data_dir=tmp_path,
        config_dir=tmp_path,
    )
    dispatcher = MessageDispatcher(md_settings, core_settings(md_settings, base), redis)
    assert dispatcher.service.hub is not None
    dispatcher.service.hub.config = HubConfig(ack_timeout_s=2.0)
    async with serve_app(dispatcher.app) as url, httpx.AsyncClient(base_url=url) as http:
        yield Md(url, http, redis, dispatcher)


async def md_task_end(md: Md, webhook: str, code: int = 0) -> None:
    """The bridge's TASK_END, posted to the dispatcher's signed callback URL."""
    data = [{"fileUrl": "http://f/1.png"}] if code == 0 else None
    body = {
        "event": "TASK_END",
        "taskId": "x",
        "eventData": orjson.dumps({"code": code, "msg": "done", "data": data}).decode(),
    }
    parts = urlsplit(webhook)
    resp = await md.http.post(f"{parts.path}?{parts.query}", json=body)
    assert resp.status_code == 200, resp.text


#: the token secret of :func:`serve_split`'s ``aigcq serve``
CLIENT_SECRET = "serve-secret-with-at-least-32-bytes-of-key"


@contextlib.asynccontextmanager
async def serve_split_with_runninghub(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, md_url: str, duration_s: float
) -> AsyncIterator[tuple[ServeProcess, Client]]:
    """:func:`serve_split` overflowing to a RunningHub emulator (concurrency 1) whose
    tasks take ``duration_s``."""
    config = RunningHubEmulatorConfig(duration_s=duration_s)
    async with (
        serve_app(create_app(config)) as rh_url,
        serve_split(tmp_path, redis, redis_url, md_url, rh_url) as (service, client),
    ):
        yield service, client


@contextlib.asynccontextmanager
async def serve_split(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, md_url: str, rh_url: str = ""
) -> AsyncIterator[tuple[ServeProcess, Client]]:
    """``aigcq serve`` with ``md_url`` as its internal target, and a connected client."""
    concurrency = 1 if rh_url else 0
    model = {"proj": {"comfyui": {"apikey": "rh-key", "concurrency": concurrency}}}
    (tmp_path / "model.json").write_text(orjson.dumps(model).decode())
    settings = Settings(
        redis_url=redis_url,
        token_secret=CLIENT_SECRET,
        config_dir=tmp_path,
        data_dir=tmp_path / "serve",
        message_dispatcher_url=md_url,
        runninghub_url=rh_url or "http://127.0.0.1:9",
    )
    target = internal_target(settings)
    assert target is not None
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis, internal=target)
    async with serve_app(service.app) as base:
        settings.callback_url = base  # where TASK_END webhooks reach this server
        port = int(base.rsplit(":", 1)[1])
        client = await Client(port, "b1", issue_client_token(CLIENT_SECRET, "b1")).connect()
        try:
            yield service, client
        finally:
            await client.close()


@pytest.fixture
def fast_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve checks the message-dispatcher's health every 100 ms (and can log in to it)."""
    monkeypatch.setenv("MESSAGE_DISPATCHER_HEALTH_CHECK_INTERVAL", "100")
    monkeypatch.setenv("MD_PASSWORD", PASSWORD)


async def cache_pending(md: Md) -> int:
    """Run the cache queue once; how many tasks still wait in it."""
    await md.dispatcher.cache.pass_once()
    return int(await md.redis.llen("md:cache:pending"))


async def next_assigns(bridge: Bridge, n: int) -> list[dict[str, Any]]:
    """The data of the next ``n`` TASK_ASSIGNs ``bridge`` receives."""
    return [(await bridge.next(timeout=10))["data"] for _ in range(n)]


@pytest.fixture
def fast_feed(md: Md) -> None:
    """The capacity feed checks for changes every 50 ms."""
    md.dispatcher.feed.config = FeedConfig(change_check_s=0.05)
