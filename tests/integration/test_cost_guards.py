"""Issue 28 item 4, per-task cost guards, through a real service and the emulators: a
project's maximum of JimuAI outputs applied before the create, and a task's ``maxCost``
that keeps it off a paid platform whose expected price is higher."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from aigcq.domain import TaskState
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge
from tests.fakes.client import generate
from tests.fakes.paid import Paid, jimuai_account, jimuai_config, models, paid_stack
from tests.fakes.waiting import until


def jimu_job(task_id: str, **extra: Any) -> dict[str, Any]:
    return generate(task_id, platform="jimuai", prompt=f"foxes {task_id}") | extra


def jimu_models(**account: Any) -> dict[str, Any]:
    return {"proj": {"jimuai": jimuai_account(**account)}}


async def test_a_project_maximum_of_one_output_sends_force_single(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # the model would make 4 images (billed 4); the project allows one
    jm = jimuai_config(outputs=4)
    model = {"proj": {"jimuai": jimuai_account(max_outputs=1)}, "free": models()["proj"]}
    model["free"]["jimuai"] = jimuai_account()
    async with paid_stack(tmp_path, redis, redis_url, model=model, jm=jm) as env:
        await env.client.request(jimu_job("one"))
        await env.client.request(jimu_job("four") | {"AIGC": "free"})
        await env.client.collect(2, timeout=20)
        assert len(env.client.results["one"][0]["data"]["data"]) == 1
        assert len(env.client.results["four"][0]["data"]["data"]) == 4
        assert (await env.jimu_stats())["force_single"] == 1


async def test_a_task_dearer_than_its_max_cost_fails_when_only_paid_platforms_run_it(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # 0.2 per image, up to 15 images without a maximum: 3.0 expected, above its 1.0
    price = {"jimuai": 0.2}
    async with paid_stack(
        tmp_path, redis, redis_url, model=jimu_models(), jm=jimuai_config(), overflow_price=price
    ) as env:
        await env.client.request(jimu_job("dear", maxCost=1.0))
        await env.client.request(jimu_job("cheap", maxCost=3))
        await env.client.collect(2, timeout=20)
        [dear] = env.client.results["dear"]
        assert (dear["status"], dear["code"]) == ("failed", "MaxCostExceeded")
        assert dear["msg"] == "任务的预计费用超过了 maxCost 上限，未提交到付费平台。"
        assert "3" in dear["error"]["message"] and "1" in dear["error"]["message"]
        assert env.client.results["cheap"][0]["status"] == "success"
        assert (await env.jimu_stats())["submits"] == 1  # only "cheap" was sent


async def test_with_a_maximum_of_outputs_the_expected_cost_is_one_image(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    price = {"jimuai": 0.2}
    model = jimu_models(max_outputs=1)
    async with paid_stack(
        tmp_path, redis, redis_url, model=model, jm=jimuai_config(), overflow_price=price
    ) as env:
        await env.client.request(jimu_job("capped", maxCost=0.5))
        await env.client.collect(1, timeout=20)
        assert env.client.results["capped"][0]["status"] == "success"


async def test_a_task_dearer_than_its_max_cost_waits_for_internal_capacity(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # no bridge yet: a comfyui task would overflow to RunningHub at 0.5, above its 0.1
    async with paid_stack(
        tmp_path,
        redis,
        redis_url,
        overflow_price={"runninghub": 0.5},
        bridge_token=BRIDGE_TOKEN,
    ) as env:
        await env.client.request(generate("waits") | {"maxCost": 0.1})
        await env.client.request(generate("paid"))  # no maxCost: overflows as before
        await env.client.collect(1, timeout=20)
        assert list(env.client.results) == ["paid"]
        await asyncio.sleep(0.5)  # time: several dispatch rounds and back-offs
        assert await env.creates("waits") == []
        assert (await env.task("waits")).state in (TaskState.PENDING, TaskState.DISPATCHING)
        bridge = await Bridge.connect(port(env))
        await bridge.register(count=1)
        assign = await bridge.next()
        assert (assign["type"], assign["data"]["taskId"]) == ("TASK_ASSIGN", "waits")
        await until(partial(env.task, "waits"), lambda t: t.target == "bridge")
        await bridge.ws.close()


async def test_max_cost_is_a_number_of_at_least_zero(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with paid_stack(tmp_path, redis, redis_url) as env:
        for bad in (-1, "1", True, None):
            reply = await env.client.request(generate(f"bad-{bad}") | {"maxCost": bad})
            if bad is None:
                assert reply["type"] == "submitted"
                continue
            assert (reply["type"], reply["code"]) == ("error", "JSONError"), reply
            assert "maxCost" in reply["detail"]
            assert await env.service.rt.store.reads.get(f"bad-{bad}") is None


def port(env: Paid) -> int:
    return int(env.base.rsplit(":", 1)[1])
