"""``EXTERNAL_CAPACITY_MAX`` (seed 000 §3.7) caps a queue's tasks in flight on its platform."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.client import generate
from tests.fakes.service import emulator_stats, stack_factory


async def test_external_cap_below_the_account_concurrency(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    stack = stack_factory(tmp_path, redis, redis_url)  # concurrency 5 in model.json
    # No webhooks (nothing listens on port 9): results are settled by the deadline query.
    emulator = RunningHubEmulatorConfig(duration_s=0.3, max_concurrent=5, webhook_retries=0)
    caps = {"external_capacity_max": 2, "task_deadline_s": 0.5}
    async with stack(emulator, callback_url="http://127.0.0.1:9", **caps) as (client, rh):
        for i in range(4):
            await client.request(generate(f"cap-{i}"))
        await client.collect(4, timeout=15)
        stats = await emulator_stats(rh)
    assert stats["created"] == 4 and max(stats["peak_concurrent"].values()) == 2
