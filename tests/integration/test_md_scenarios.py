"""Seed 000 §10 scenarios 1 and 2 in the split topology:
client → ``aigcq serve`` → ``aigcq dispatcher`` → bridges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import tests.fakes.message_dispatcher as mds
from aigcq.mdclient.target import MessageDispatcherTarget
from tests.fakes.bridge import Bridge
from tests.fakes.client import Client, generate
from tests.fakes.waiting import until, wait_until

md = mds.md  # the dispatcher fixture
fast_checks = mds.fast_checks
fast_feed = mds.fast_feed


def _free(target: Any) -> int:
    assert isinstance(target, MessageDispatcherTarget)
    return target.free_slots()


async def _run_to_the_end(md: mds.Md, bridge: Bridge, client: Client, tasks: int) -> set[str]:
    """``bridge`` runs whatever it is given; the task ids whose results reach ``client``."""
    done: set[str] = set()
    while len(done) < tasks:
        assign = (await bridge.next(timeout=10))["data"]
        await bridge.ack(assign["taskId"])
        await mds.md_task_end(md, assign["webhookUrl"])
        result = await client.next(timeout=10)
        assert result["type"] == "result" and result["status"] == "success", result
        done.add(result["taskId"])
    return done


@pytest.mark.usefixtures("fast_checks", "fast_feed")
async def test_scenario_1_internal_capacity_drops(
    md: mds.Md, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """4 instances, 4 tasks, 2 instances go: the 2 not started go back to the cache queue,
    the running ones go on, nothing crashes, and the cache drains on what is left."""
    staying, leaving = await Bridge.connect(md.port), await Bridge.connect(md.port)
    await staying.register("stay", count=2)
    await leaving.register("leave", count=2)
    async with mds.serve_split(tmp_path, redis, redis_url, md.base) as (service, client):
        await wait_until(lambda: _free(service.internal) == 4)
        for i in range(4):
            await client.request(generate(f"s1-{i}"))
        started = await mds.next_assigns(staying, 2)
        await mds.next_assigns(leaving, 2)  # assigned, never started
        for assign in started:
            await staying.ack(assign["taskId"])
        await leaving.ws.close()
        assert await until(lambda: mds.cache_pending(md), lambda n: n == 2) == 2
        health = (await md.http.get("/api/health")).json()["data"]
        assert health["bridges"] == 1 and health["freeSlots"] == 0
        await wait_until(lambda: _free(service.internal) == 0)
        for assign in started:
            await mds.md_task_end(md, assign["webhookUrl"])
        finished = {(await client.next(timeout=10))["taskId"] for _ in started}
        finished |= await _run_to_the_end(md, staying, client, 2)
        assert finished == {f"s1-{i}" for i in range(4)}
    await staying.ws.close()


@pytest.mark.usefixtures("fast_checks", "fast_feed")
async def test_scenario_2_more_tasks_sent_than_instances_left(
    md: mds.Md, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The backend sent 4 tasks for 4 free instances; by the time they arrive only 2 are
    left: 2 run, 2 wait in the cache queue (accepted, not refused or lost) and run later."""
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=4)
    async with mds.serve_split(tmp_path, redis, redis_url, md.base) as (service, client):
        await wait_until(lambda: _free(service.internal) == 4)
        for i in range(4):
            await client.request(generate(f"s2-{i}"))
        assigns = await mds.next_assigns(bridge, 4)
        await bridge.send("HEARTBEAT", {"instanceCount": 2, "availableInstanceCount": 0})
        for assign in assigns[:2]:
            await bridge.ack(assign["taskId"])
        for assign in assigns[2:]:
            await bridge.ack(assign["taskId"], code=1)  # no instance left for it
        assert await until(lambda: mds.cache_pending(md), lambda n: n == 2) == 2
        for task_id in (f"s2-{i}" for i in range(4)):
            task = await service.rt.store.reads.get(task_id)
            assert task is not None and task.state == "running"
            assert task.target == "message_dispatcher"
        for assign in assigns[:2]:
            await mds.md_task_end(md, assign["webhookUrl"])
        finished = {(await client.next(timeout=10))["taskId"] for _ in range(2)}
        await bridge.send("HEARTBEAT", {"instanceCount": 2, "availableInstanceCount": 2})
        finished |= await _run_to_the_end(md, bridge, client, 2)
        assert finished == {f"s2-{i}" for i in range(4)}
    await bridge.ws.close()
