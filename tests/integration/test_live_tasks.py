"""``GET /api/admin/live-tasks`` against a real Redis: the tasks waiting and running now,
where each runs (bridge and instance) and for how long, filtered and paged, the same from
either of two serve processes on one Redis (issue 29 item 2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN
from tests.fakes.client import generate
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET, Env
from tests.fakes.waiting import until

ADMIN = "admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
MODELS = '{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}, "other": {"comfyui": {}}}'


def settings(tmp_path: Path, redis_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        bridge_token=BRIDGE_TOKEN,
        admin_token=ADMIN,
    )


@pytest.fixture
async def env(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Env]:
    (tmp_path / "model.json").write_text(MODELS)
    service = ServeProcess(settings(tmp_path, redis_url), PlatformConfig.load(tmp_path), redis)
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        yield env
        for ws in env.sockets:
            await ws.close()


@pytest.fixture
async def other(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, env: Env
) -> AsyncIterator[str]:
    """A second serve process on the same Redis: its base URL."""
    service = ServeProcess(settings(tmp_path, redis_url), PlatformConfig.load(tmp_path), redis)
    async with serve_app(service.app) as base:
        yield base


async def live(base: str, **params: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base) as http:
        r = await http.get("/api/admin/live-tasks", params=params, headers=ADMIN_HEADERS)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def ids(page: dict[str, Any]) -> list[str]:
    return [t["taskId"] for t in page["tasks"]]


BUSY = [{"instanceId": "gpu0:8188", "url": "http://gpu0:8188", "state": "busy", "taskId": "L1"}]


async def test_live_tasks_show_where_and_how_long_filtered_and_paged(env: Env, other: str) -> None:
    bridge = await env.bridge()
    idle = [{**BUSY[0], "state": "idle", "taskId": None}]
    await bridge.register(count=1, instances=idle)
    client = await env.client()
    for task_id in ("L1", "L2", "L3"):
        await client.request(generate(task_id))
    assert (await bridge.next())["data"]["taskId"] == "L1"
    await bridge.ack("L1")
    await bridge.send(
        "HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 0, "instances": BUSY}
    )
    page = await until(partial(live, env.base), lambda p: p["tasks"][0]["instance"] != "")
    assert page["total"] == 3 and page["counts"] == {"pending": 2, "dispatching": 0, "running": 1}
    running, first_waiting, _ = page["tasks"]
    assert ids(page) == ["L1", "L2", "L3"]  # in flight first, then the queue, oldest first
    assert (running["state"], running["target"], running["bridge"]) == ("running", "bridge", "br1")
    assert running["instance"] == "gpu0:8188" and running["attempt"] == 1
    assert running["inStateS"] >= 0 and running["ageS"] >= running["inStateS"]
    assert (first_waiting["state"], first_waiting["target"], first_waiting["bridge"]) == (
        "pending",
        "",
        "",
    )
    assert (first_waiting["AIGC"], first_waiting["platform"]) == ("proj", "comfyui")
    where = [(t["taskId"], t["state"], t["bridge"], t["instance"]) for t in page["tasks"]]
    elsewhere = (await live(other))["tasks"]  # the same from the process without the bridge
    assert [(t["taskId"], t["state"], t["bridge"], t["instance"]) for t in elsewhere] == where

    second = await live(env.base, offset=1, limit=1)
    assert ids(second) == ["L2"] and second["total"] == 3
    assert ids(await live(env.base, offset=2, limit=5)) == ["L3"]
    assert ids(await live(env.base, offset=3)) == []
    assert ids(await live(env.base, state="running")) == ["L1"]
    waiting = await live(env.base, state="pending")
    assert ids(waiting) == ["L2", "L3"] and waiting["total"] == 2
    assert waiting["counts"]["running"] == 1  # the counts ignore the state filter
    assert ids(await live(env.base, target="bridge")) == ["L1"]  # a waiting task runs nowhere
    assert ids(await live(env.base, platform="comfyui", project="proj")) == ["L1", "L2", "L3"]
    nothing = await live(env.base, project="other")
    assert nothing["tasks"] == [] and nothing["total"] == 0
    await client.close()


async def test_a_task_backing_off_comes_before_the_queue_and_says_so(env: Env) -> None:
    client = await env.client()
    for task_id in ("D1", "D2"):
        await client.request(generate(task_id))
    store = env.service.rt.store
    [claimed] = await store.claim(
        "proj", "comfyui", "runninghub", cap=-1, n=1, deadline_s=60
    )  # D1, as a dispatch would
    assert await store.requeue_unrun("D1", claimed.attempt, "full", delay_s=600)
    page = await live(env.base)
    assert ids(page) == ["D1", "D2"] and page["counts"]["pending"] == 2
    assert [t["backingOff"] for t in page["tasks"]] == [True, False]
    await client.close()


async def test_a_cancelled_task_leaves_the_live_list(env: Env) -> None:
    client = await env.client()
    await client.request(generate("C1"))
    assert ids(await live(env.base)) == ["C1"]
    async with httpx.AsyncClient(base_url=env.base) as http:
        await http.post("/api/tasks/C1/cancel", headers=ADMIN_HEADERS)
    assert (await live(env.base))["total"] == 0
    await client.close()


async def test_bad_filters_are_refused_with_a_code_and_the_list_needs_the_admin_token(
    env: Env,
) -> None:
    async with httpx.AsyncClient(base_url=env.base) as http:
        path = "/api/admin/live-tasks"
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert (await http.get(path, headers=headers)).status_code == 401
        for params in ({"state": "success"}, {"limit": 0}, {"limit": 201}, {"offset": -1}):
            r = await http.get(path, params=params, headers=ADMIN_HEADERS)
            assert r.status_code == 400 and r.json()["code"] == "JSONError", (params, r.text)
