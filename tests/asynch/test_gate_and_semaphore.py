"""The queue-limit gate and the concurrency semaphore: atomic, runtime-first, never leaked."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aigcq.asynch.lease import LeaseKeeper
from aigcq.asynch.rebuild import RUN_ID_KEY
from aigcq.asynch.runtime import runtime_max_concurrency_key, runtime_queue_limit_key
from aigcq.asynch.semaphore import Semaphore
from aigcq.asynch.tasks_repo import ClaimedTask
from aigcq.plumbing import background
from tests.fakes.asynch import Asynch, Served
from tests.fakes.servers import closed_port
from tests.fakes.waiting import until, wait_until


async def _create_many(asynch: Asynch, model: str, n: int) -> list[int]:
    body = {"modelName": model, "requestPayload": {}, "bizName": "b"}
    responses = await asyncio.gather(
        *(asynch.call("POST", "/task/createTask", json=body) for _ in range(n))
    )
    return [r.status_code for r in responses]


async def test_exactly_queue_limit_of_50_concurrent_creates(
    asynch: Asynch, model_emu: Served
) -> None:
    model_emu.app.state.behaviour.latency = 0.5
    await asynch.create_model("m", model_emu.url, queueLimit=7, maxConcurrency=3)
    statuses = await _create_many(asynch, "m", 50)
    assert statuses.count(200) == 7 and statuses.count(429) == 43
    cur = await asynch.db.execute("SELECT count(*) FROM asynch_task")
    assert await cur.fetchone() == (7,)
    # the gate holds the 7 but those already done (on a slow host some may be): read the
    # gate first, then what is done, so a task ending in between is in both counts
    gate = await asynch.redis.zcard("asynch:gate:m")
    cur = await asynch.db.execute("SELECT count(*) FROM asynch_task WHERE state = 2")
    row = await cur.fetchone()
    assert row is not None and 7 - row[0] <= gate <= 7
    await asynch.error("POST", "/task/createTask", "QUEUE_FULL",
                       json={"modelName": "m", "requestPayload": {}, "bizName": "b"})  # fmt: skip
    cur = await asynch.db.execute("SELECT task_id FROM asynch_task")
    for (task_id,) in await cur.fetchall():
        await asynch.wait_state(task_id, 2)
    assert await asynch.redis.zcard("asynch:gate:m") == 0  # released on success
    assert (await model_emu.stats())["peak"] == 3
    assert await asynch.redis.zcard("asynch:sem:m:default") == 0


async def test_runtime_limits_come_first_but_never_above_the_cap(
    asynch: Asynch, model_emu: Served
) -> None:
    model_emu.app.state.behaviour.latency = 0.3
    await asynch.create_model("m", model_emu.url, queueLimit=5, maxConcurrency=3)
    await asynch.redis.set(runtime_queue_limit_key("m"), 2)
    await asynch.redis.set(runtime_max_concurrency_key("m"), 1)
    assert (await _create_many(asynch, "m", 6)).count(200) == 2
    await until(model_emu.stats, lambda s: s["current"] >= 1)  # the first call is running
    await asyncio.sleep(0.1)  # time: a second call at once would have arrived by now
    assert (await model_emu.stats())["peak"] == 1

    await asynch.db.execute("TRUNCATE asynch_task")
    await asynch.redis.delete("asynch:gate:m")
    await asynch.redis.set(runtime_queue_limit_key("m"), 50)
    assert (await _create_many(asynch, "m", 8)).count(200) == 5


async def test_failure_releases_and_retry_retakes_the_gate(
    asynch: Asynch, model_emu: Served
) -> None:
    await asynch.create_model("m", model_emu.url, queueLimit=1, retryTimes=1)
    model_emu.app.state.behaviour.failure_rate = 1.0
    task_id = await asynch.create_task("m")
    await asynch.wait_state(task_id, 3)
    assert await asynch.redis.zcard("asynch:gate:m") == 0
    other = await asynch.create_task("m")  # the freed slot is usable at once
    await asynch.wait_state(other, 3)
    model_emu.app.state.behaviour.failure_rate = 0.0
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["requeued"] == 1  # the queue holds one: the second retry must wait
    (requeued,) = [t for t in (task_id, other) if (await asynch.row(t))["state"] == 0]
    assert await asynch.redis.zrange("asynch:gate:m", 0, -1) == [requeued]
    await asynch.ok("POST", "/task/runWork")
    assert (await asynch.row(requeued))["state"] == 2
    assert (await asynch.ok("POST", "/task/cleanWork"))["requeued"] == 1


async def test_reconcile_frees_leaked_and_restores_lost_slots(
    asynch: Asynch, model_emu: Served
) -> None:
    model_emu.app.state.behaviour.latency = 1.0
    await asynch.create_model("m", model_emu.url, queueLimit=3)
    live = await asynch.create_task("m")
    await asynch.redis.zadd("asynch:gate:m", {"ghost-1": 1.0, "ghost-2": 2.0})  # leaked
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["gate_released"] == 2
    assert await asynch.redis.zrange("asynch:gate:m", 0, -1) == [live]
    await asynch.redis.delete("asynch:gate:m")  # e.g. Redis lost its data
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["gate_restored"] == 1
    assert await asynch.redis.zrange("asynch:gate:m", 0, -1) == [live]


async def test_expired_semaphore_leases_are_reclaimed(asynch: Asynch) -> None:
    sem = asynch.svc.semaphore
    assert await sem.acquire("m", "t", "a:1", 1)
    assert not await sem.acquire("m", "t", "b:1", 1)
    assert await sem.acquire("m", "other-tenant", "c:1", 1)  # per tenant + model
    await asynch.redis.zadd("asynch:sem:m:t", {"a:1": 0})  # its holder died long ago
    assert await sem.acquire("m", "t", "b:1", 1)
    assert await sem.holders("m", "t") == ["b:1"]


async def test_a_running_attempt_keeps_its_lease_past_its_length_until_it_stops(
    redis: aioredis.Redis,
) -> None:
    await redis.set(RUN_ID_KEY, "test")
    sem = Semaphore(redis, lease_seconds=0.3)
    task = ClaimedTask("t1", "m", "tenant", "creator", "biz", "", "", {}, "", "", attempt=1)
    assert await sem.acquire("m", "tenant", task.lease_id, 1)
    keeper = LeaseKeeper(sem, task)
    await asyncio.sleep(1.0)  # time: over three lease lengths: alive only because it was renewed
    assert await sem.holders("m", "tenant") == [task.lease_id]
    assert not await sem.acquire("m", "tenant", "t2:1", 1)
    await keeper.stop()
    await asyncio.sleep(0.5)  # time: no longer renewed: it expires and the slot is free again
    assert await sem.holders("m", "tenant") == []
    assert await sem.acquire("m", "tenant", "t2:1", 1)


async def test_a_lease_keeper_stopped_at_once_renews_nothing(redis: aioredis.Redis) -> None:
    await redis.set(RUN_ID_KEY, "test")
    sem = Semaphore(redis, lease_seconds=0.3)
    task = ClaimedTask("t1", "m", "tenant", "creator", "biz", "", "", {}, "", "", attempt=1)
    assert await sem.acquire("m", "tenant", task.lease_id, 1)
    keeper = LeaseKeeper(sem, task)
    await keeper.stop()
    await asyncio.sleep(0.5)  # time: renewals were due at 0.1, 0.2, 0.3 s: none kept it alive
    assert await sem.holders("m", "tenant") == []


async def test_renewals_go_on_after_redis_fails_one(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(background, "OUTAGE_REPORT_S", 0.0)  # every failed renewal is a line

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "renewing the semaphore lease" in r.getMessage()]

    with closed_port() as port:  # nothing answers there while the test runs
        unreachable = aioredis.Redis(port=port, retry=Retry(NoBackoff(), 0))  # fails at once
        sem = Semaphore(unreachable, lease_seconds=0.15)  # a renewal due every 50 ms
        task = ClaimedTask("t1", "m", "tenant", "creator", "biz", "", "", {}, "", "", attempt=1)
        with caplog.at_level(logging.WARNING, logger="aigcq.asynch.lease"):
            keeper = LeaseKeeper(sem, task)
            await wait_until(lambda: len(failures()) >= 2)  # it went on after the first
            await keeper.stop()
        await unreachable.aclose()
    assert len(failures()) >= 2 and all("t1" in r.getMessage() for r in failures())
