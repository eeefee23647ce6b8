"""Graceful shutdown hands in-flight work back: an in-process serve process is stopped while tasks
are claimed but not yet handed to a target (a platform submit hanging, a TASK_ASSIGN not
acknowledged); they are waiting again, their attempt uncharged, instead of waiting for a
deadline — except a create that may be out, which is never sent again blindly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.domain import TaskState
from aigcq.serve import shutdown
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN
from tests.fakes.client import generate
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET, Env
from tests.fakes.waiting import until, wait_until


class HangingPlatform:
    """An ASGI app whose every request hangs until ``release`` is set: a platform that
    never answers a submit."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.requests += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def make_service(tmp_path: Path, redis: aioredis.Redis, redis_url: str, rh: str) -> ServeProcess:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 2}}}')
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        bridge_token=BRIDGE_TOKEN,
        runninghub_url=rh,
        sweep_interval_s=0.2,
    )
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    service.shutdown_grace_s = 0.3
    return service


@pytest.fixture
async def platform() -> AsyncIterator[tuple[HangingPlatform, str]]:
    app = HangingPlatform()
    async with serve_app(app) as base:  # type: ignore[arg-type]
        yield app, base
        app.release.set()


async def test_stopping_during_a_platform_submit_never_resends_it_blindly(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, platform: tuple[HangingPlatform, str]
) -> None:
    hanging, rh = platform
    service = make_service(tmp_path, redis, redis_url, rh)
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        client = await env.client()
        for task_id in ("s1", "s2"):
            await client.request(generate(task_id))
        for task_id in ("s1", "s2"):
            task = await until(partial(env.task, task_id), lambda t: t.state == "dispatching")
            assert task.attempt == 1 and task.target == "runninghub"
        await wait_until(lambda: hanging.requests == 2)
        await client.close()
    # The server is down: both submits were cancelled while the creates were out (the
    # platform got them): not handed back to be paid twice, but left with their create
    # recorded, for the sweeper to resolve (issue 15 item 1).
    for task_id in ("s1", "s2"):
        task = await env.task(task_id)
        assert task.state == TaskState.DISPATCHING and task.create_id
        assert task.target == "runninghub"
    waiting = await redis.zrange(service.rt.store.keys.wait("proj", "comfyui"), 0, -1)
    assert waiting == []


async def test_unacknowledged_bridge_tasks_go_back_and_a_late_ack_is_ignored(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, platform: tuple[HangingPlatform, str]
) -> None:
    (tmp_path / "cfg").mkdir()
    service = make_service(tmp_path / "cfg", redis, redis_url, platform[1])
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        bridge = await env.bridge()
        await bridge.register(count=2)
        client = await env.client()
        for task_id in ("b1", "b2"):
            await client.request(generate(task_id))
        ids = {(await bridge.next())["data"]["taskId"] for _ in range(2)}
        assert ids == {"b1", "b2"}
        # The hub's part of the shutdown path, with the bridge still connected.
        handed = await shutdown.hand_back(service, grace_s=0.3)
        assert sorted(handed) == ["b1", "b2"]
        for task_id in ids:
            task = await env.task(task_id)
            assert task.state == TaskState.PENDING and (task.attempt, task.charged) == (1, 0)
        await bridge.ack("b1")  # too late: the task is no longer this bridge's
        await client.request(generate("b3"))  # stopped: nothing more is claimed
        await asyncio.sleep(0.5)  # time: a claim would have happened by now
        assert (await env.task("b1")).state == TaskState.PENDING
        assert (await env.task("b3")).state == TaskState.PENDING
        assert service.hub is not None and service.hub.free_slots() == 2
        await client.close()
        for ws in env.sockets:
            await ws.close()
