"""Deadlines: ask the platform before retrying (never pay twice), then retry, then fail."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.client import generate
from tests.fakes.service import emulator_stats, stack_factory


async def test_lost_webhook_is_settled_by_asking_the_platform(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    stack = stack_factory(tmp_path, redis, redis_url)
    # Webhooks go nowhere (nothing listens on port 9): only the deadline query can tell.
    emulator = RunningHubEmulatorConfig(duration_s=0.1, webhook_retries=0)
    async with stack(emulator, callback_url="http://127.0.0.1:9", task_deadline_s=0.8) as (
        client,
        rh,
    ):
        await client.request(generate("lost-1"))
        await client.collect(1, timeout=15)
        assert client.results["lost-1"][0]["status"] == "success"
        stats = await emulator_stats(rh)
        assert stats["created"] == 1  # settled from /outputs, not paid for again


async def test_stuck_task_is_cancelled_retried_then_failed(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    stack = stack_factory(tmp_path, redis, redis_url)
    emulator = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    async with stack(emulator, task_deadline_s=0.5) as (client, rh):
        await client.request(generate("stuck-1"))
        await client.collect(1, timeout=20)
        result = client.results["stuck-1"][0]
        assert result["status"] == "failed" and result["code"] == "TaskTimeout"
        stats = await emulator_stats(rh)
        assert stats["created"] == 2 and stats["cancelled"] == 2  # max_attempts = 2
