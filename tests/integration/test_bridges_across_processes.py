"""Two aigcq processes on one Redis (issue 24 items 6 and 7): what one process knows of a
bridge, any process knows; a task's end received by one process acts on the bridge another
holds, and the retry of a machine failure waits for the slot it frees, not for RunningHub.

Each test that pays would pay on today's mechanism: RunningHub is configured throughout.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.bridges.hub import BridgeHub
from aigcq.plumbing.auth import issue_client_token
from aigcq.scheduler import lifecycle
from tests.fakes.bridge import INSTANCE_LOST, Bridge, task_end
from tests.fakes.client import Client, generate
from tests.fakes.service import SECRET, Env, Pair, serve_pair
from tests.fakes.waiting import until, wait_until


@pytest.fixture
async def pair(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Pair]:
    async with serve_pair(tmp_path, redis, redis_url) as p:
        yield p


def hub_of(env: Env) -> BridgeHub:
    hub = env.service.hub
    assert hub is not None
    return hub


async def registered(
    env: Env, bridge_id: str, count: int = 1, *, seen_by: Env | None = None
) -> Bridge:
    """A bridge ``bridge_id`` with ``count`` free instances, registered with ``env``'s hub
    (its record says so: the REGISTER is handled), and counted by ``seen_by``'s."""
    bridge = await env.bridge()
    await bridge.register(bridge_id, count=count)
    held = ["1", hub_of(env).peers.process_id]
    key = f"aigcq:bridge:{bridge_id}"
    await until(lambda: env.redis.hmget(key, ["online", "process"]), lambda got: got == held)
    if seen_by is not None:
        await wait_until(lambda: hub_of(seen_by).peers.elsewhere >= count)
    return bridge


async def left(env: Env, bridge: Bridge, bridge_id: str) -> None:
    """Close ``bridge``'s socket; until ``env``'s hub has noticed."""
    await bridge.ws.close()
    await wait_until(lambda: bridge_id not in hub_of(env).registry.bridges)


async def assigned(bridge: Bridge, task_id: str) -> dict[str, Any]:
    """The next frame: a TASK_ASSIGN of ``task_id``, acknowledged; its data."""
    msg = await bridge.next()
    assert (msg["type"], msg["data"]["taskId"]) == ("TASK_ASSIGN", task_id), msg
    await bridge.ack(task_id)
    data: dict[str, Any] = msg["data"]
    return data


async def running(env: Env, task_id: str, attempt: int) -> None:
    await until(lambda: env.task(task_id), lambda t: t.state == "running" and t.attempt == attempt)


async def test_a_bridge_with_a_new_id_gets_work_at_once_after_the_old_one_left(
    pair: Pair,
) -> None:
    """A replacement bridge (a seed bridge picks a new uuid each start) is capacity that
    never failed: no stability period while tasks go to RunningHub (was 28 s, 8 paid)."""
    a = pair.a
    old = await registered(a, "old-uuid", seen_by=pair.b)
    client = await a.client()
    await client.request(generate("on-old"))
    await assigned(old, "on-old")
    await left(a, old, "old-uuid")
    new = await registered(a, "new-uuid", seen_by=pair.b)
    await client.request(generate("on-new"))
    await assigned(new, "on-new")
    assert (await a.task("on-new")).target == "bridge"
    assert await pair.paid_creates() == 0


async def test_a_bridge_moving_to_a_process_that_lost_its_bridges_is_usable_at_once(
    pair: Pair,
) -> None:
    a, b = pair.a, pair.b
    gone = await registered(a, "gone")
    await left(a, gone, "gone")  # a has had a bridge, and lost it: degraded
    assert not hub_of(a).healthy
    mover = await registered(b, "mover")
    await left(b, mover, "mover")
    mover = await registered(a, "mover", seen_by=b)
    client = await a.client()
    await client.request(generate("moved"))
    await assigned(mover, "moved")
    assert await pair.paid_creates() == 0


async def test_a_quarantined_bridge_stays_out_when_it_moves_and_its_cool_down_goes_on(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve_pair(
        tmp_path, redis, redis_url, bridge_failure_limit=1, bridge_quarantine_s=60
    ) as pair:
        a, b = pair.a, pair.b
        failing = await registered(b, "failing", seen_by=a)
        client = await a.client()
        await client.request(generate("fails"))
        hook = (await assigned(failing, "fails"))["webhookUrl"]
        await running(a, "fails", 1)
        assert await task_end(a, hook, code=1, failure=INSTANCE_LOST) == 200
        key = "aigcq:bridge:failing"
        since = float(await until(lambda: redis.hget(key, "quarantinedAt"), bool))
        moved_at = time.time()
        await left(b, failing, "failing")
        await registered(a, "failing")
        conn = hub_of(a).registry.bridges["failing"]
        assert conn.quarantined_at is not None and hub_of(a).free_slots() == 0
        again = float(await redis.hget(key, "quarantinedAt") or 0)
        assert again < moved_at and abs(again - since) < 0.002  # not a fresh cool-down


async def test_a_machine_failure_reported_to_another_process_is_retried_on_its_bridge(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge (one instance) is connected to b; its TASK_END, an instance lost, reaches
    a. The retry waits for b to free the slot, then runs there: RunningHub is never paid
    (was paid in 9 of 10 tries). It is b's release that lets it run, not the fallback."""
    monkeypatch.setattr(lifecycle, "RELEASE_WAIT_S", 600.0)
    a, b = pair.a, pair.b
    bridge = await registered(b, "on-b", seen_by=a)
    client = await a.client()
    for i in range(5):
        task_id = f"lost-{i}"
        await client.request(generate(task_id))
        hook = (await assigned(bridge, task_id))["webhookUrl"]
        await running(a, task_id, 1)
        assert await task_end(a, hook, code=1, failure=INSTANCE_LOST) == 200
        retry = await assigned(bridge, task_id)
        assert retry["attempt"] == 2
        await running(a, task_id, 2)
        assert await task_end(a, retry["webhookUrl"]) == 200
        await result_of(client, task_id)
    assert await pair.paid_creates() == 0


async def test_a_retry_whose_slot_is_never_released_still_runs(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b never hears of the end (its event lost): after RELEASE_WAIT_S the retry is routed
    all the same; its bridge still looks busy, so it goes to RunningHub."""
    monkeypatch.setattr(lifecycle, "RELEASE_WAIT_S", 0.3)
    a, b = pair.a, pair.b
    monkeypatch.setattr(hub_of(b).ends, "remote_task_end", lambda event: None)
    bridge = await registered(b, "deaf", seen_by=a)
    client = await a.client()
    await client.request(generate("unreleased"))
    hook = (await assigned(bridge, "unreleased"))["webhookUrl"]
    await running(a, "unreleased", 1)
    assert await task_end(a, hook, code=1, failure=INSTANCE_LOST) == 200
    task = await until(lambda: a.task("unreleased"), lambda t: t.attempt == 2)
    assert task.target == "runninghub"


async def test_a_superseded_attempt_on_another_process_is_stopped_there(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Attempt 1 runs on b's bridge, attempt 2 on a's; attempt 2's end reaches a: b tells
    its bridge to stop attempt 1 and frees the slot."""
    async with serve_pair(tmp_path, redis, redis_url, concurrency=0) as pair:
        a, b = pair.a, pair.b
        first = await registered(b, "first")
        client = await a.client()
        await client.request(generate("sup"))
        await assigned(first, "sup")
        await running(a, "sup", 1)
        second = await registered(a, "second")
        await a.service.rt.store.requeue_for_retry("sup", 1, "test: deadline passed")
        new = await assigned(second, "sup")
        assert new["attempt"] == 2
        await running(a, "sup", 2)
        assert await task_end(a, new["webhookUrl"]) == 200
        stop = await first.next()
        assert stop == {"type": "TASK_CANCEL", "data": {"taskId": "sup", "attempt": 1}}
        await wait_until(lambda: hub_of(b).free_slots() == 1)


async def result_of(client: Client, task_id: str) -> dict[str, Any]:
    while True:
        msg = await client.next()
        if msg.get("type") == "result" and msg.get("taskId") == task_id:
            return msg


async def test_a_queue_s_capacity_counts_the_bridges_of_every_process(pair: Pair) -> None:
    """Two idle one-slot bridges, one per process: ``GET /api/queues`` (and so ``aigcq
    status``) on either says capacity ``bridge: 2`` (it said 1, its own bridge's slot,
    while the same view counted both once they were busy)."""
    a, b = pair.a, pair.b
    await registered(a, "on-a", seen_by=b)
    await registered(b, "on-b", seen_by=a)
    headers = {"Authorization": f"Bearer {issue_client_token(SECRET, 'ops')}"}
    async with httpx.AsyncClient(base_url=a.base) as http:
        row = (await http.get("/api/queues", headers=headers)).json()[0]
    assert row["capacity"]["bridge"] == 2
