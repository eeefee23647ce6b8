"""Paid creates answered by something other than the platform's word, or after their task
moved on: a gateway's page is not a refusal, and a definite "not created" frees the slot."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import redis.asyncio as aioredis

from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.client import generate
from tests.fakes.paid import models, paid_stack
from tests.fakes.waiting import until


async def test_a_gateway_page_on_a_create_that_went_through_is_not_sent_again(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    rh = RunningHubEmulatorConfig(duration_s=3.0)  # outlasts a retry's 1 s back-off
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=models()) as env:
        await env.faults(gateway_create_replies=1)
        await env.client.request(generate("g1"))
        await env.client.collect(1, timeout=15)
        assert env.client.results["g1"][0]["status"] == "success"  # by its webhook
        assert len(await env.creates("g1")) == 1  # created (and billed) once


async def test_a_cancelled_tasks_create_answered_full_frees_its_slot_at_once(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Cancelled while its create is out, the task's slot is kept as ``create:<id>``; the
    platform then answers "full" (nothing created): the slot is free at once, not after the
    600 s deadline (issue 25 item 4)."""
    async with paid_stack(tmp_path, redis, redis_url, model=models()) as env:
        await env.faults(full_create_replies=1, delay_create_reply_s=1.0)
        await env.client.request(generate("c1"))
        await until(partial(env.task, "c1"), lambda t: bool(t.create_id), within=10)
        reply = await env.client.request({"type": "cancel", "taskId": "c1"})
        assert reply["type"] == "cancelled"
        orphans = env.service.rt.store.keys.orphans("proj", "runninghub")
        assert await redis.zcard(orphans) == 1  # the create is out: its slot is kept
        await until(partial(redis.zcard, orphans), lambda n: n == 0, within=5)
        assert await env.creates("c1") == []  # refused as full: nothing was created
