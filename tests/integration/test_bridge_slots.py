"""Every end of a task on a bridge frees its slot at once, not at the bridge's next
HEARTBEAT (30 s away): a client's cancel, a TASK_END refused as gone. An idle one-GPU
bridge must not look busy, or the next task overflows to the paid platform.

Also the seed-002 bridge that acknowledges with its own taskId, and TASK_CANCEL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from aigcq.bridges.hub import HubConfig
from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge, instances_with, task_end
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import model_graph
from tests.fakes.service import Env, env, service_with_runninghub
from tests.fakes.waiting import until, wait_until

__all__ = ["env"]  # a fixture: imported for pytest to find

TOKEN = "client-token-for-the-overflow-test"


async def one_running(env: Env, task_id: str) -> tuple[Bridge, Client, dict[str, Any]]:
    """A one-slot bridge running ``task_id`` (acknowledged): its bridge, client, TASK_ASSIGN."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate(task_id))
    assign: dict[str, Any] = (await bridge.next())["data"]
    await bridge.ack(task_id)
    await until(lambda: env.task(task_id), lambda t: t.state == "running")
    return bridge, client, assign


async def test_a_client_cancel_frees_the_slot_and_stops_the_task_on_its_bridge(env: Env) -> None:
    bridge, client, assign = await one_running(env, "c1")
    reply = await client.request({"type": "cancel", "taskId": "c1"})
    assert reply["type"] == "cancelled"
    stop = await bridge.next()
    assert stop == {"type": "TASK_CANCEL", "data": {"taskId": "c1", "attempt": 1}}
    await client.request(generate("c2"))  # no HEARTBEAT in between
    assert (await bridge.next())["data"]["taskId"] == "c2"
    assert await task_end(env, assign["webhookUrl"], code=1) == 410
    await bridge.ws.close()
    await client.close()


async def test_a_task_end_refused_as_gone_frees_the_slot(env: Env) -> None:
    """The task was settled without the hub (a lost reply on finish, a process that
    crashed): its TASK_END is answered 410, and the slot is free all the same."""
    bridge, client, assign = await one_running(env, "g1")
    await env.service.rt.store.finish("g1", TaskState.FAILED, error={"code": "x"}, note="test")
    assert await task_end(env, assign["webhookUrl"]) == 410
    await client.request(generate("g2"))
    assert (await bridge.next())["data"]["taskId"] == "g2"
    await bridge.ws.close()
    await client.close()


async def test_a_bridge_that_stops_listing_a_task_frees_its_slot(env: Env) -> None:
    bridge, client, _ = await one_running(env, "h1")
    await client.request(generate("h2"))
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.3)  # the only slot is taken
    await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1, "tasks": []})
    assert (await bridge.next())["data"]["taskId"] == "h2"
    await bridge.ws.close()
    await client.close()


async def test_a_seed_002_ack_with_the_bridges_own_id_binds_to_the_oldest_assignment(
    env: Env,
) -> None:
    bridge = await env.bridge()
    await bridge.register(count=2)
    client = await env.client()
    for task_id in ("s1", "s2"):
        await client.request(generate(task_id))
    assigns = [(await bridge.next())["data"] for _ in range(2)]
    for own in ("1910000000000000001", "1910000000000000002"):
        body = {"taskId": own, "taskStatus": "RUNNING"}
        await bridge.send("TASK_ACK", {"code": 0, "msg": "success", "data": body})
    for a, own in zip(assigns, ("1910000000000000001", "1910000000000000002"), strict=True):
        task = await until(lambda a=a: env.task(a["taskId"]), lambda t: t.state == "running")
        assert task.remote_id == own
    with pytest.raises(TimeoutError):  # no UnknownTask, no assignment again
        await bridge.next(timeout=0.5)
    for a in assigns:
        assert await task_end(env, a["webhookUrl"]) == 200
    assert {(await client.next())["taskId"] for _ in range(2)} == {"s1", "s2"}
    await bridge.ws.close()
    await client.close()


async def test_a_seed_002_bridge_runs_20_tasks_once_each(env: Env) -> None:
    """It ACKs with its own taskId and no attempt, and POSTs TASK_END with that id."""
    # The test answers one assignment at a time while up to three more wait in the socket:
    # on a loaded machine the last of them waits longer than the fixture's 1 s ACK timeout.
    assert env.service.hub is not None
    env.service.hub.config = HubConfig(ack_timeout_s=30.0)
    bridge = await env.bridge()
    await bridge.register(count=4)
    client = await env.client()
    ids = [f"seed-{i}" for i in range(20)]
    for task_id in ids:
        await client.request(generate(task_id))
    assigned: list[str] = []
    for n in range(20):
        assign = (await bridge.next())["data"]
        assigned.append(assign["taskId"])
        own = f"1910{n:015d}"
        body = {"taskId": own, "taskStatus": "RUNNING"}
        await bridge.send("TASK_ACK", {"code": 0, "msg": "success", "data": body})
        await until(lambda a=assign: env.task(a["taskId"]), lambda t: t.state == "running")
        assert await task_end(env, assign["webhookUrl"]) == 200
    assert sorted(assigned) == sorted(ids)  # each assigned once
    results = [(await client.next())["taskId"] for _ in ids]
    assert sorted(results) == sorted(ids)
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.5)
    await bridge.ws.close()
    await client.close()


def _needing(task_id: str, ckpt: str) -> dict[str, Any]:
    return generate(task_id, workflow=model_graph(ckpt))


async def test_a_task_goes_only_to_a_bridge_that_has_its_model_files(env: Env) -> None:
    idle = await env.bridge()  # the least loaded, but without the model
    await idle.register("idle", count=4, instances=instances_with("a.safetensors"))
    busy = await env.bridge()
    await busy.register(
        "has-b", count=2, instances=instances_with("a.safetensors", "b.safetensors")
    )
    client = await env.client()
    await client.request(_needing("needs-b", "b.safetensors"))
    assert (await busy.next())["data"]["taskId"] == "needs-b"
    await client.request(_needing("needs-c", "c.safetensors"))  # nobody has it
    result = await client.next()
    assert (result["taskId"], result["status"]) == ("needs-c", "failed")
    assert result["error"]["code"] == "NoCapableInstance"
    assert "model files: c.safetensors" in result["error"]["detail"]
    with pytest.raises(TimeoutError):
        await idle.next(timeout=0.3)
    for ws in (idle.ws, busy.ws):
        await ws.close()
    await client.close()


async def test_a_superseded_attempt_is_stopped_on_its_bridge_when_another_finishes(
    env: Env,
) -> None:
    first, client, old = await one_running(env, "sup")
    await env.service.rt.store.requeue_for_retry("sup", 1, "test: deadline passed")
    second = await env.bridge()
    await second.register("br2", count=1)
    new = (await second.next())["data"]
    assert (new["taskId"], new["attempt"]) == ("sup", 2)
    await second.ack("sup")
    await until(lambda: env.task("sup"), lambda t: t.state == "running" and t.attempt == 2)
    assert await task_end(env, new["webhookUrl"]) == 200
    stop = await first.next()
    assert stop == {"type": "TASK_CANCEL", "data": {"taskId": "sup", "attempt": 1}}
    hub = env.service.hub
    assert hub is not None and old["attempt"] == 1
    assert hub.registry.bridges["br1"].free() == 1  # its slot is free again
    for ws in (first.ws, second.ws):
        await ws.close()
    await client.close()


async def test_a_workflow_the_registry_has_but_a_bridge_cannot_fetch_fails_after_its_attempts(
    env: Env,
) -> None:
    """Code 380 for a registered workflow is retried as new attempts, not looped forever."""
    rt = env.service.rt
    await env.redis.set(rt.store.keys.workflow("wf-known"), json.dumps(model_graph("a")))
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("known", workflowId="wf-known", nodeInfoList=[]))
    attempts = []
    while len(attempts) < rt.settings.max_attempts:
        assign = (await bridge.next(timeout=15))["data"]
        attempts.append(assign["attempt"])
        refusal = {"taskId": "known", "attempt": assign["attempt"]}
        await bridge.send("TASK_ACK", {"code": 380, "msg": "workflow not found", "data": refusal})
        await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1})
    assert attempts == list(range(1, rt.settings.max_attempts + 1))
    result = await client.next(timeout=15)
    assert (result["taskId"], result["status"]) == ("known", "failed")
    assert result["error"]["detail"]["code"] == "WorkflowNotFound"
    await bridge.ws.close()
    await client.close()


async def test_a_task_whose_capable_bridge_is_busy_overflows_not_to_an_idle_incapable_one(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Internal capacity for a task is the free slots that can run it: the idle bridge
    lacks its model, the one that has it is busy, so it goes to RunningHub as when every
    slot is busy (``overflow_after_ms`` 0), in its first attempt."""
    models = '{"proj": {"comfyui": {"apikey": "k", "concurrency": 2}}}'
    emulator = RunningHubEmulatorConfig(duration_s=0.1)
    async with service_with_runninghub(
        tmp_path, redis, redis_url, models=models, emulator=emulator, token=TOKEN,
        bridge_token=BRIDGE_TOKEN,
    ) as stack:  # fmt: skip
        port = int(stack.base.rsplit(":", 1)[1])
        idle, busy = await Bridge.connect(port), await Bridge.connect(port)
        await idle.register("idle", count=2, instances=instances_with("a.safetensors"))
        await busy.register("has-b", count=1, instances=instances_with("b.safetensors"))
        hub = stack.service.hub
        # the hub has both REGISTERs (a task sent before might find no bridge for it)
        await wait_until(lambda: {"idle", "has-b"} <= set(hub.registry.bridges))
        client = await Client(port, "b1", TOKEN).connect()
        await client.request(_needing("b-1", "b.safetensors"))
        assert (await busy.next())["data"]["taskId"] == "b-1"
        await client.request(_needing("b-2", "b.safetensors"))
        result = await client.next(timeout=10)
        assert (result["taskId"], result["status"]) == ("b-2", "success"), result
        task = await stack.service.rt.store.reads.get("b-2")
        assert task is not None and (task.target, task.attempt) == ("runninghub", 1)
        with pytest.raises(TimeoutError):
            await idle.next(timeout=0.3)
        for ws in (idle.ws, busy.ws, client.ws):
            await ws.close()


async def test_a_failed_task_end_frees_the_slot_though_its_count_is_not_saved(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine's failure takes the bridge out of rotation (limit 1) and saving that
    fails (Redis away): the task's slot is freed all the same, not kept till a HEARTBEAT."""
    hub = env.service.hub
    assert hub is not None
    env.service.rt.settings.bridge_failure_limit = 1
    bridge, client, assign = await one_running(env, "q1")

    async def redis_away(*args: Any, **kwargs: Any) -> int:
        raise redis_errors.ConnectionError("Redis away")

    monkeypatch.setattr(hub.registry, "save", redis_away)
    assert await task_end(env, assign["webhookUrl"], code=1) == 200
    conn = hub.registry.bridges["br1"]
    await wait_until(lambda: conn.quarantined_at is not None)
    await wait_until(lambda: not conn.slots.holds("q1"))
    await bridge.ws.close()
    await client.close()
