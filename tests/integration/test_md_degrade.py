"""Seed 000 §9.4.1 in the split topology: the dispatcher loses instances while tasks wait
in its cache queue; those beyond what is left go back to ``aigcq serve`` (TASK_DEGRADE on
the capacity feed) and run on RunningHub, each result delivered exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import tests.fakes.message_dispatcher as mds
from aigcq.dispatcher.degrade import HANDED_BACK
from aigcq.domain import TaskState
from aigcq.mdclient.target import MessageDispatcherTarget
from tests.fakes.bridge import Bridge
from tests.fakes.client import Client, generate
from tests.fakes.waiting import until, wait_until

md = mds.md
fast_checks = mds.fast_checks
fast_feed = mds.fast_feed


def _target(service: Any) -> MessageDispatcherTarget:
    target = service.internal
    assert isinstance(target, MessageDispatcherTarget)
    return target


async def _results(client: Client, n: int) -> dict[str, list[dict[str, Any]]]:
    await client.collect(n, timeout=20)
    await client.linger(0.5)  # a duplicate would arrive now
    return client.results


@pytest.mark.usefixtures("fast_checks", "fast_feed")
async def test_excess_tasks_go_back_and_run_on_runninghub(
    md: mds.Md, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """6 tasks sent for 6 free instances; the bridge runs 2 and refuses 4 (its instances
    turned busy), which wait in the cache queue; then it drops to 1 instance: the 3 newest
    waiting go back to ``aigcq serve`` and run on RunningHub, the oldest stays and runs
    here; every result arrives once. (Were the first HEARTBEAT a drop too, its hand-back
    would race the refusals.)"""
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=6)
    async with mds.serve_split_with_runninghub(
        tmp_path, redis, redis_url, md.base, duration_s=0.1
    ) as (service, client):
        target = _target(service)
        await wait_until(lambda: target.free_slots() == 6)
        await wait_until(lambda: len(md.dispatcher.feed.subscribers) == 1)
        ids = [f"dg-{i}" for i in range(6)]
        for task_id in ids:
            await client.request(generate(task_id))
        assigns = await mds.next_assigns(bridge, 6)
        await bridge.send("HEARTBEAT", {"instanceCount": 6, "availableInstanceCount": 0})
        for assign in assigns[:2]:
            await bridge.ack(assign["taskId"])
        for assign in assigns[2:]:
            await bridge.ack(assign["taskId"], code=1)  # no instance for it
        assert await until(lambda: mds.cache_pending(md), lambda n: n == 4) == 4
        running = {a["taskId"] for a in assigns[:2]}
        waiting = [a["taskId"] for a in assigns[2:]]

        await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 0})
        back = await until(lambda: _handed_back(md, waiting), lambda t: len(t) == 3)
        for task_id in running:  # started: never handed back
            task = await md.task(task_id)
            assert task is not None and task.state is TaskState.RUNNING
        stays = set(waiting) - back
        assert len(stays) == 1
        stayed = await md.task(stays.pop())
        assert stayed is not None and stayed.state is TaskState.PENDING
        assert stayed.created_at <= min(t.created_at for t in await _md_tasks(md, list(back)))
        await client.collect(3, timeout=20)  # the 3 handed back, on RunningHub
        on_rh = [await service.rt.store.reads.get(t) for t in client.results]
        assert [t.target for t in on_rh if t is not None] == ["runninghub"] * 3

        for assign in assigns[:2]:
            await mds.md_task_end(md, assign["webhookUrl"])
        await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1})
        last = (await bridge.next(timeout=10))["data"]
        assert last["taskId"] == stayed.task_id
        await bridge.ack(last["taskId"])
        await mds.md_task_end(md, last["webhookUrl"])

        results = await _results(client, 6)
        assert set(results) == set(ids)
        assert all(len(r) == 1 and r[0]["status"] == "success" for r in results.values())
        targets = [(await service.rt.store.reads.get(t)) for t in ids]
        by_target = [t.target for t in targets if t is not None]
        assert by_target.count("runninghub") == 3, by_target
        assert by_target.count("message_dispatcher") == 3, by_target

        # A late notice for tasks that have finished or moved on changes nothing.
        before = [(t.state, t.attempt, t.target) for t in targets if t is not None]
        assert await target.take_back([*back, *running, "unknown"]) == []
        after = [(await service.rt.store.reads.get(t)) for t in ids]
        assert [(t.state, t.attempt, t.target) for t in after if t is not None] == before
    await bridge.ws.close()


@pytest.mark.usefixtures("fast_checks", "fast_feed")
async def test_tasks_of_a_backend_not_on_the_feed_stay_pending(md: mds.Md) -> None:
    """No backend on the capacity feed allocated them: nobody to hand them to, they stay."""
    token = await md.token()
    body = {**mds.BODY, "apiKey": token, "webhookUrl": "http://127.0.0.1:9/hook"}
    ids = [(await md.http.post("/api/task", json=body)).json()["data"]["taskId"] for _ in "ab"]
    assert await md.dispatcher.degrader.shrink(0) == 0
    for task_id in ids:
        task = await md.task(task_id)
        assert task is not None and task.state is TaskState.PENDING


async def test_withdraw_takes_only_a_waiting_task(md: mds.Md) -> None:
    store = md.dispatcher.service.rt.store
    token = await md.token()
    body = {**mds.BODY, "apiKey": token, "webhookUrl": "http://127.0.0.1:9/hook"}
    task_id = (await md.http.post("/api/task", json=body)).json()["data"]["taskId"]
    error = {"code": HANDED_BACK, "message": "test"}
    assert await store.withdraw(task_id, error=error, note="test")
    assert not await store.withdraw(task_id, error=error, note="again")
    task = await md.task(task_id)
    assert task is not None and task.state is TaskState.CANCELLED
    assert await md.redis.xlen("md:outbox:webhook") == 0  # no TASK_END for it
    status = await md.http.post("/task/openapi/status", json={"apiKey": token, "taskId": task_id})
    assert status.json()["code"] == 807  # its backend's again


async def _md_tasks(md: mds.Md, ids: list[str]) -> list[Any]:
    return [t for t in [await md.task(i) for i in ids] if t is not None]


async def _handed_back(md: mds.Md, ids: list[str]) -> set[str]:
    tasks = await _md_tasks(md, ids)
    return {
        t.task_id
        for t in tasks
        if t.state is TaskState.CANCELLED and (t.error or {}).get("code") == HANDED_BACK
    }
