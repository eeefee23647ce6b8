"""A paid task whose webhook never comes is asked about after a silence, not left holding
its slot and its client until the deadline (issue 25 item 6)."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.scheduler.silence import SilentTasks
from tests.fakes.client import generate
from tests.fakes.paid import models, paid_stack


async def test_a_lost_webhook_is_made_up_for_by_asking_runninghub(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    rh = RunningHubEmulatorConfig(duration_s=0.2)
    async with paid_stack(
        tmp_path,
        redis,
        redis_url,
        rh=rh,
        model=models(concurrency=1),  # its one slot is held until the task is settled
        callback_url="http://127.0.0.1:9",  # every webhook is lost
        paid_silence_s=1.0,
    ) as env:
        await env.client.request(generate("s1"))
        await env.client.request(generate("s2"))
        await env.client.collect(2, timeout=20)  # the deadline is 600 s
        assert [env.client.results[t][0]["status"] for t in ("s1", "s2")] == ["success"] * 2
        assert len(await env.creates("s1")) == len(await env.creates("s2")) == 1


async def test_a_fleet_asks_about_a_silent_task_once_per_silence(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Two processes' loops on one Redis: whichever claims a silent task asks about it;
    the other leaves it until the silence has passed again."""
    async with paid_stack(tmp_path, redis, redis_url, model=models()) as env:
        here, there = env.service.silent_tasks, SilentTasks(env.service.lifecycle)
        assert await here._claim(["t1", "t2"], 60.0) == ["t1", "t2"]
        assert await there._claim(["t1", "t2", "t3"], 60.0) == ["t3"]
        assert 59_000 < await redis.pttl(env.service.rt.store.keys.silence_asked("t1")) <= 60_000
