"""Issue 25 item 2: an accepted paid create is never forgotten. RunningHub took (and bills)
the task; however long Redis does not answer, the remote id is held and written once it
does, so the task's result is found (its webhook, or asking RunningHub) instead of the
task failing with ``UncertainSubmit``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio as aioredis

from aigcq.embedded.redis import EmbeddedRedis
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.client import generate
from tests.fakes.paid import created, models, paid_stack


async def test_an_accepted_create_outlives_a_long_redis_outage(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """The create is accepted while Redis is down for longer than 5 s (its webhook, sent
    meanwhile, is lost): once Redis is back the remote id is recorded, and RunningHub's
    answer settles the task. One create, one success."""
    redis = aioredis.Redis.from_url(private_redis.url, decode_responses=True)
    rh = RunningHubEmulatorConfig(duration_s=0.2, webhook_retries=1, webhook_backoff_s=0.2)
    model = models(deadline_s=3.0)
    try:
        async with paid_stack(
            tmp_path, redis, private_redis.url, rh=rh, model=model, paid_silence_s=1.0
        ) as env:
            await env.faults(delay_create_reply_s=1.0)
            await env.client.request(generate("a1"))
            await created(env, "a1")
            private_redis.stop()
            await asyncio.sleep(6.0)  # time: longer than Redis was ever retried before
            private_redis.start()
            await env.client.collect(1, timeout=30)
            result = env.client.results["a1"][0]
            assert result["status"] == "success", result
            assert len(await env.creates("a1")) == 1
    finally:
        await redis.aclose()
