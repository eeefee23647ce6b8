"""Issue 42 item 2: an operator's retry reaches an SDK caller. Each result says which
attempt of its task it ends (``attempt``, an additive field); the SDK (``AsyncClient``)
takes a later attempt's end as the task's new result, not as a copy of the one it has.

A real service, the RunningHub emulator, signed TASK_END webhooks posted by hand (the
callback URL the emulator gets is dead, so the test decides when each run ends), the
admin API's retry and the SDK over a real WebSocket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from aigcq.client import AsyncClient, Result
from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.client import generate
from tests.fakes.paid import TOKEN, Paid, paid_stack
from tests.fakes.waiting import until

ADMIN = "attempts-admin-token"
FAILED = {"code": 805, "msg": "APIKEY_TASK_STATUS_ERROR", "data": None}
SUCCESS = {"code": 0, "msg": "success", "data": [{"fileUrl": "http://x/1.png", "fileType": "png"}]}


@asynccontextmanager
async def stack(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Paid]:
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    dead = {"callback_url": "http://127.0.0.1:9", "admin_token": ADMIN}
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, **dead) as env:
        yield env


async def cancelled_on_the_sdk(env: Paid, sdk: AsyncClient, task_id: str) -> Result:
    """``task_id`` runs on RunningHub, an operator cancels it, the SDK caller has that."""
    frame = generate(task_id)
    await sdk.submit(frame["platform"], frame["payload"], task_id=task_id, aigc="proj")
    await until(partial(env.task, task_id), lambda t: t.state is TaskState.RUNNING)
    await env.service.gateway.cancel(task_id, None)
    return await sdk.result(task_id, timeout=10)


async def retry(env: Paid, task_id: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=env.base) as http:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        return await http.post(f"/api/admin/tasks/{task_id}/retry", headers=headers)


async def next_result(sdk: AsyncClient, task_id: str) -> Result:
    async for event in sdk.events(task_id):
        if isinstance(event, Result):
            return event
    raise AssertionError("the client closed")


async def test_an_operators_retry_reaches_the_sdk_caller(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path, redis, redis_url) as env:
        url = env.base.replace("http://", "ws://") + "/"
        async with AsyncClient(url, TOKEN, "sdk") as sdk:
            first = await cancelled_on_the_sdk(env, sdk, "a1")
            assert (first.status, first.attempt) == ("cancelled", 1)
            assert await env.post_task_end("a1", 1, FAILED, here=True) == 410  # its run ended
            listening = asyncio.create_task(next_result(sdk, "a1"))
            assert (await retry(env, "a1")).json() == {"taskId": "a1", "state": "pending"}
            await until(partial(env.task, "a1"), lambda t: t.attempt == 2 and t.remote_id)
            assert await env.post_task_end("a1", 2, SUCCESS, here=True) == 200
            second = await asyncio.wait_for(listening, 10)
            assert (second.status, second.attempt) == ("success", 2)
            assert (await sdk.result("a1", timeout=1)) is second


async def test_a_replayed_paid_result_reaches_the_sdk_caller(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The cancelled run's success came anyway (kept, not delivered); an operator's retry
    delivers it, paying nothing: the SDK caller gets it after the cancel."""
    async with stack(tmp_path, redis, redis_url) as env:
        url = env.base.replace("http://", "ws://") + "/"
        async with AsyncClient(url, TOKEN, "sdk") as sdk:
            first = await cancelled_on_the_sdk(env, sdk, "k1")
            assert await env.post_task_end("k1", 1, SUCCESS, here=True) == 410  # kept
            listening = asyncio.create_task(next_result(sdk, "k1"))
            assert (await retry(env, "k1")).json() == {"taskId": "k1", "state": "success"}
            second = await asyncio.wait_for(listening, 10)
            assert second.ok and second.attempt > first.attempt
            assert (await sdk.result("k1", timeout=1)) is second
