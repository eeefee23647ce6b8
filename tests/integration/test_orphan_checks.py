"""Orphan checks run in a loop of their own; one that fails is asked again later, with
back-off, and does not keep the others from being checked (issue 25 item 5)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.domain import Task
from tests.fakes.paid import models, paid_stack


async def test_a_failing_check_is_rescheduled_and_the_others_still_run(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with paid_stack(tmp_path, redis, redis_url, model=models(), sweep_interval_s=3600) as env:
        service, store = env.service, env.service.rt.store
        service.dispatch.stopped = True  # this test makes its orphans by hand
        for task_id in ("o1", "o2"):
            await store.submit(
                task_id, aigc="proj", platform="comfyui", backend_id="b1", payload={}
            )
        claimed = await store.claim("proj", "comfyui", "runninghub", cap=-1, n=2, deadline_s=30)
        for c in claimed:  # running as R-o1, R-o2, then cancelled: unwanted, still counted
            remote = f"R-{c.task_id}"
            where = ("proj", "comfyui", "runninghub")
            await store.mark_running(
                c.task_id, c.attempt, remote, deadline_s=60, kind="callback", where=where
            )
            await service.lifecycle.cancelled(await env.task(c.task_id), by_client=True)
        key = store.keys.orphans("proj", "runninghub")
        assert sorted(await redis.zrange(key, 0, -1)) == ["R-o1", "R-o2"]
        await redis.zadd(key, {"R-o1": 1, "R-o2": 2})  # both due now, the broken one first
        peek = service.rt.platforms.peek

        async def broken_for_o1(adapter: Any, task: Task, apikey: str) -> Any:
            if task.remote_id == "R-o1":
                raise RuntimeError("a bug in one check")
            return await peek(adapter, task, apikey)

        monkeypatch.setattr(service.rt.platforms, "peek", broken_for_o1)
        assert await service.orphan_checks.check_due() == 1  # R-o2: RunningHub has no such task
        assert await redis.zrange(key, 0, -1) == ["R-o1"]
        next_check = float(await redis.zscore(key, "R-o1") or 0)
        assert next_check > time.time() + 2  # backing off, not due again at once
