"""The scheduler in the live dispatch path (issues 27 and 37, fair by default): two serve
processes on one Redis, fake bridges whose runs end when the test says, RunningHub's
emulator as the paid platform.

A flooding project does not take every slot from another; a priority credit reorders a
tenant's own tasks; a task past its start deadline ends ``TaskExpired`` unpaid; a task with
a deadline goes paid only when its estimated start would miss it; the paid cap holds with
two processes planning at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.plumbing.auth import issue_client_token
from aigcq.scheduler.pauses import PauseKind, Pauses
from tests.fakes.bridge import Bridge, task_end
from tests.fakes.client import Client, generate
from tests.fakes.service import SECRET, Env, Pair, serve_pair
from tests.fakes.waiting import until, wait_until


@pytest.fixture
async def pair(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Pair]:
    """No paid room (concurrency 0): whatever finds no GPU waits for one."""
    async with serve_pair(
        tmp_path, redis, redis_url, concurrency=0, projects=("calm", "flood")
    ) as p:
        yield p


async def bridge_on(env: Env, bridge_id: str, count: int = 1, *, seen_by: Env) -> Bridge:
    """A bridge with ``count`` free instances on ``env``, counted by ``seen_by`` too."""
    bridge = await env.bridge()
    await bridge.register(bridge_id, count=count)
    hub = env.service.hub
    other = seen_by.service.hub
    assert hub is not None and other is not None
    await wait_until(lambda: hub.free_slots() >= count, 10)
    await wait_until(lambda: other.peers.elsewhere >= count, 10)
    return bridge


async def assigned(bridge: Bridge) -> tuple[str, str]:
    """The next TASK_ASSIGN, acknowledged: its task id and webhook URL."""
    msg = await bridge.next(timeout=15.0)
    assert msg["type"] == "TASK_ASSIGN", msg
    data: dict[str, Any] = msg["data"]
    await bridge.ack(data["taskId"])
    return data["taskId"], data["webhookUrl"]


async def submitted(client: Client, task_id: str, aigc: str = "proj", **fields: Any) -> None:
    reply = await client.request(generate(task_id, aigc=aigc) | fields)
    assert reply["type"] == "submitted", reply


async def waiting(env: Env, *task_ids: str) -> None:
    """Until every one of ``task_ids`` is in its queue (so a round sees them all)."""
    for task_id in task_ids:
        await until(lambda t=task_id: env.task(t), lambda t: t.state == "pending")


async def test_a_flooding_project_does_not_take_every_slot(pair: Pair) -> None:
    a, b = pair.a, pair.b
    bridge = await bridge_on(a, "br1", seen_by=b)
    client = await b.client()
    await submitted(client, "flood-0", "flood")
    first, hook = await assigned(bridge)
    assert first == "flood-0"
    for i in range(1, 9):
        await submitted(client, f"flood-{i}", "flood")
    await submitted(client, "calm-0", "calm")
    await submitted(client, "calm-1", "calm")
    await waiting(a, "flood-8", "calm-1")
    order = []
    for _ in range(4):  # one slot: each end frees it for the next
        assert await task_end(a, hook) == 200
        task_id, hook = await assigned(bridge)
        order.append(task_id)
    # the flood has used the fleet; the calm project's two tasks come first, then it and
    # the flood share (calm-1 before the flood's second run)
    assert order[0] == "calm-0", order
    assert "calm-1" in order[:3], order
    assert await pair.paid_creates() == 0


async def test_runs_on_our_gpus_charge_their_tenant_as_they_start(pair: Pair) -> None:
    """Issue 37 item 3: each task that starts on a bridge (acknowledged, on either process)
    charges its project and user its workflow's recent mean; nothing is charged at the
    claim, and a project none of whose tasks ran has no usage."""
    a, b = pair.a, pair.b
    redis, keys = a.service.rt.redis, a.service.rt.store.keys
    await redis.hset(keys.runs, "wf-7", "12.5 3")
    bridge = await bridge_on(a, "br1", count=2, seen_by=b)
    client = await b.client()
    for task_id in ("c-0", "c-1"):
        task = generate(task_id, aigc="calm", workflowId="wf-7", nodeInfoList=[])
        reply = await client.request({**task, "userId": "u"})
        assert reply["type"] == "submitted", reply
        await assigned(bridge)

    async def charged(key: str) -> float:
        return float((await redis.get(key) or "0 0").split()[0])

    for key in (keys.usage("calm"), keys.usage("calm", "u")):
        value = await until(lambda key=key: charged(key), lambda v: v > 24.0, within=10)
        assert value == pytest.approx(25.0, rel=1e-3)  # decayed by a few ms at most
    assert await redis.get(keys.usage("flood")) is None


async def test_a_priority_credit_runs_first_within_its_tenant(pair: Pair) -> None:
    a, b = pair.a, pair.b
    bridge = await bridge_on(a, "br1", seen_by=b)
    client = await a.client()
    await submitted(client, "p-0", "calm")
    _, hook = await assigned(bridge)
    await submitted(client, "p-1", "calm")
    await submitted(client, "p-2", "calm")
    await submitted(client, "p-urgent", "calm", priority=60)
    await waiting(a, "p-1", "p-2", "p-urgent")
    assert await task_end(a, hook) == 200
    task_id, hook = await assigned(bridge)
    assert task_id == "p-urgent"
    assert await task_end(a, hook) == 200
    task_id, _ = await assigned(bridge)
    assert task_id == "p-1"


async def test_a_priority_above_its_projects_bound_is_refused(pair: Pair) -> None:
    client = await pair.a.client()
    reply = await client.request(generate("too-high", aigc="calm") | {"priority": 10_000})
    assert reply["type"] == "error" and reply["code"] == "JSONError", reply
    assert "priority" in reply["detail"], reply
    assert await pair.a.service.rt.store.reads.get("too-high") is None


async def test_a_task_past_its_start_deadline_ends_task_expired_unpaid(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve_pair(
        tmp_path,
        redis,
        redis_url,
        concurrency=0,  # no paid room: a task that would miss its start cannot be rescued
        projects=("calm",),
        share_default_run_s=600,
    ) as pair:
        a, b = pair.a, pair.b
        await bridge_on(a, "br1", seen_by=b)
        client = await a.client()
        await submitted(client, "busy", "calm")
        await until(lambda: a.task("busy"), lambda t: t.target == "bridge")
        await submitted(client, "late", "calm", maxWaitMs=300)
        await submitted(client, "stays", "calm", maxWaitMs=300, keepWaiting=True)
        await client.collect(1, timeout=30)
        [result] = client.results["late"]
        assert (result["status"], result["code"]) == ("failed", "TaskExpired"), result
        assert result["msg"] == a.service.rt.config.messages.get("TaskExpired")
        task = await a.task("late")
        assert task.error is not None and task.error["code"] == "TaskExpired"
        assert task.attempt == 0 and await pair.paid_creates() == 0
        assert (await a.task("stays")).state == "pending"


async def test_a_deadline_goes_paid_only_when_its_start_would_miss_it(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve_pair(
        tmp_path, redis, redis_url, projects=("calm",), share_default_run_s=5
    ) as pair:
        a, b = pair.a, pair.b
        bridge = await bridge_on(a, "br1", seen_by=b)
        client = await a.client()
        await submitted(client, "busy", "calm")
        _, hook = await assigned(bridge)
        await until(lambda: a.task("busy"), lambda t: t.state == "running")
        await submitted(client, "patient", "calm", maxWaitMs=120_000)  # starts in ~5 s
        # would start too late (~5 s); 4 s leaves a loaded host time to send it paid first
        await submitted(client, "urgent", "calm", maxWaitMs=4_000)
        await until(lambda: a.task("urgent"), lambda t: t.target == "runninghub", within=15)
        assert (await a.task("patient")).state == "pending"
        assert await task_end(a, hook) == 200
        task_id, _ = await assigned(bridge)
        assert task_id == "patient"
        assert await pair.paid_creates() == 1


async def test_the_paid_cap_holds_with_two_processes_planning(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve_pair(
        tmp_path,
        redis,
        redis_url,
        concurrency=2,
        projects=("calm",),
        share_default_run_s=600,
    ) as pair:
        a, b = pair.a, pair.b
        on_a = await bridge_on(a, "br-a", seen_by=b)
        on_b = await bridge_on(b, "br-b", seen_by=a)
        client = await a.client()  # both processes plan every round: a wake reaches both
        for i in range(8):  # every one would miss its start on our GPUs: paid, up to the cap
            fields = {"maxWaitMs": 60_000, "keepWaiting": True}
            await submitted(client, f"t{i}", "calm", **fields)
        for bridge in (on_a, on_b):
            await assigned(bridge)
        ids = [f"t{i}" for i in range(8)]
        store = a.service.rt.store
        tasks = await until(
            lambda: store.reads.heads(ids),
            lambda ts: sum(t.target == "runninghub" for t in ts) >= 2,
            within=15,
        )
        await wait_until(lambda: pair.paid_creates(), 15)
        assert sum(t.target == "runninghub" for t in tasks) == 2
        assert sum(t.target == "bridge" for t in await store.reads.heads(ids)) == 2
        assert await pair.paid_creates() == 2


async def test_a_users_limit_holds_across_both_processes(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """``AIGCQ_USER_MAX_RUNNING=1``: with a free slot on each process, a user's second task
    waits while its first runs; another user's task takes the other slot."""
    async with serve_pair(
        tmp_path,
        redis,
        redis_url,
        concurrency=0,
        projects=("calm",),
        user_max_running=1,
    ) as pair:
        a, b = pair.a, pair.b
        on_a = await bridge_on(a, "br-a", seen_by=b)
        on_b = await bridge_on(b, "br-b", seen_by=a)
        client = await a.client()
        await submitted(client, "u-0", "calm", userId="u")
        await submitted(client, "u-1", "calm", userId="u")
        await submitted(client, "v-0", "calm", userId="v")
        ids = ["u-0", "u-1", "v-0"]
        store = a.service.rt.store
        tasks = await until(
            lambda: store.reads.heads(ids), lambda ts: sum(t.target == "bridge" for t in ts) == 2
        )
        assert {t.task_id for t in tasks if t.target == "bridge"} == {"u-0", "v-0"}
        assert (await a.task("u-1")).state == "pending"
        # u-0 ends (on whichever bridge has it): u-1 may run now
        for bridge, env in ((on_a, a), (on_b, b)):
            task_id, hook = await assigned(bridge)
            if task_id == "u-0":
                assert await task_end(env, hook) == 200
        await until(lambda: a.task("u-1"), lambda t: t.target == "bridge", within=15)


async def test_the_http_submit_takes_the_fields_and_refuses_bad_ones(pair: Pair) -> None:
    headers = {"Authorization": f"Bearer {issue_client_token(SECRET, 'b1')}"}
    body = generate("h1", aigc="calm") | {
        "priority": 5,
        "userId": "u-7",
        "maxWaitMs": 60_000,
        "keepWaiting": True,
    }
    async with httpx.AsyncClient() as http:
        ok = await http.post(f"{pair.a.base}/api/tasks", json=body, headers=headers)
        bad = await http.post(
            f"{pair.a.base}/api/tasks",
            json=body | {"taskId": "h2", "maxWaitMs": -5},
            headers=headers,
        )
    assert ok.status_code == 202, ok.text
    stored = await pair.a.redis.hgetall("aigcq:task:h1")
    assert (stored["userId"], float(stored["credit"]), stored["keepWaiting"]) == ("u-7", 5.0, "1")
    assert float(stored["startBy"]) - float(stored["created"]) == pytest.approx(60.0)
    assert bad.status_code == 400 and bad.json()["code"] == "JSONError", bad.text
    assert "maxWaitMs" in bad.json()["detail"]
    assert not await pair.a.redis.exists("aigcq:task:h2")


async def test_a_ready_task_behind_a_deep_paused_workflow_runs_at_once(pair: Pair) -> None:
    """Issue 37 items 2 and 8, with default settings and two serves: 1,500 tasks of a
    paused workflow at the head of the queue hide nothing; the next task of another
    workflow is assigned to the free GPU at once, and the paused ones run on resume."""
    a, b = pair.a, pair.b
    pauses = Pauses(a.service.rt)
    await pauses.set(PauseKind.WORKFLOW, "held", True)
    client = await b.client()
    for i in range(1500):
        await client.send(generate(f"held-{i}", aigc="calm", workflowId="held", nodeInfoList=[]))
    for _ in range(1500):
        assert (await client.next(timeout=60))["type"] == "submitted"
    bridge = await bridge_on(a, "br1", seen_by=b)
    await submitted(client, "ready", "calm")
    task_id, hook = await assigned(bridge)
    assert task_id == "ready"
    await pauses.set(PauseKind.WORKFLOW, "held", False)
    assert await task_end(a, hook) == 200
    task_id, _ = await assigned(bridge)
    assert task_id == "held-0"


async def test_a_limited_users_deep_batch_leaves_the_other_gpu_to_another_user(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Issue 37 items 1 and 8, two serves, AIGCQ_USER_MAX_RUNNING=1: one user's 1,500 tasks
    at the head run one at a time; another user's single task takes the second GPU."""
    async with serve_pair(
        tmp_path, redis, redis_url, concurrency=0, projects=("calm",), user_max_running=1
    ) as pair:
        a, b = pair.a, pair.b
        bridge = await bridge_on(a, "br1", count=2, seen_by=b)
        client = await b.client()
        got: list[str] = []

        async def acknowledging() -> None:  # as a bridge does, however long the submits take
            while True:
                with contextlib.suppress(TimeoutError):
                    got.append((await assigned(bridge))[0])

        reader = asyncio.create_task(acknowledging())
        try:
            for i in range(1500):
                await client.send({**generate(f"batch-{i}", aigc="calm"), "userId": "heavy"})
            for _ in range(1500):
                assert (await client.next(timeout=60))["type"] == "submitted"
            await submitted(client, "single", "calm", userId="light")
            await wait_until(lambda: len(got) >= 2, 15, what="two tasks assigned")
            await asyncio.sleep(1.0)  # the heavy user's second task waits: nothing more comes
        finally:
            reader.cancel()
        assert sorted(got) == ["batch-0", "single"]
