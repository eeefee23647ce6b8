"""A gateway's HTML 502 on a paid create that went through is not a refusal: the task is
not created (and billed) again; its webhook still brings the result (issue 25 item 1)."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.e2e.conftest import generate
from tests.integration.paid_stack import models, paid_stack


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
