"""Capacity is the bridge's current truth (issue 24): nothing is withheld on a guess.

* A refusal that says nothing about capacity (380, workflow not found) frees the slot at
  once; a refusal carrying the bridge's counts is applied at once; a seed bridge's bare 421
  keeps the slot withheld until its HEARTBEAT.
* A bridge task past its deadline, still held by its bridge, is not claimed again in a loop.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from aigcq.domain import TaskState
from tests.fakes.client import generate
from tests.fakes.comfyui import model_graph
from tests.fakes.service import Env, env
from tests.fakes.waiting import until

__all__ = ["env"]  # a fixture: imported for pytest to find

__all__ = ["env"]


async def test_a_workflow_not_found_refusal_frees_the_slot_at_once(env: Env) -> None:
    """380 for a workflow nobody knows fails that task; the next valid task is assigned to
    the same one-slot bridge at once, not after its next HEARTBEAT (issue 24, item 1)."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("bad", workflowId="nobody-has-it", nodeInfoList=[]))
    assign = (await bridge.next())["data"]
    refusal = {"taskId": "bad", "attempt": assign["attempt"]}
    await bridge.send("TASK_ACK", {"code": 380, "msg": "workflow not found", "data": refusal})
    await until(lambda: env.task("bad"), lambda t: t.state == TaskState.FAILED)
    refused_at = time.monotonic()
    await client.request(generate("good"))
    nxt = await bridge.next(timeout=2.0)  # no HEARTBEAT in between
    assert (nxt["type"], nxt["data"]["taskId"]) == ("TASK_ASSIGN", "good")
    took = time.monotonic() - refused_at
    assert took < 1.0
    print(f"380 refusal -> next task assigned: {took:.3f}s")
    assert env.service.hub is not None
    assert env.service.hub.registry.bridges["br1"].slots.withheld == 0
    await bridge.ws.close()
    await client.close()


async def test_a_known_workflow_refused_380_is_retried_without_waiting_for_a_heartbeat(
    env: Env,
) -> None:
    """380 for a workflow the registry holds (a bridge that could not fetch it) is retried
    as a new attempt; the bridge's slot is free for it (380 says nothing about capacity)."""
    rt = env.service.rt
    await env.redis.set(rt.store.keys.workflow("wf-known"), json.dumps(model_graph("a")))
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("known", workflowId="wf-known", nodeInfoList=[]))
    first = (await bridge.next())["data"]
    refusal = {"taskId": "known", "attempt": first["attempt"]}
    await bridge.send("TASK_ACK", {"code": 380, "msg": "workflow not found", "data": refusal})
    # the retry's back-off is min(attempt, 10) s: 1 s here, and no HEARTBEAT is sent
    again = (await bridge.next(timeout=4.0))["data"]
    assert (again["taskId"], again["attempt"]) == ("known", first["attempt"] + 1)
    await bridge.ws.close()
    await client.close()


async def test_a_refusal_with_counts_is_applied_at_once(env: Env) -> None:
    """A 421 that carries the bridge's counts is applied at once, not guessed: here its one
    instance was busy (someone else's prompt) when the TASK_ASSIGN came and is free again
    when the refusal is built, so the task is sent again without waiting for a HEARTBEAT."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("r1"))
    first = (await bridge.next())["data"]
    counts = {"instanceCount": 1, "availableInstanceCount": 1}
    refusal = {"taskId": "r1", "attempt": first["attempt"]}
    await bridge.send(
        "TASK_ACK", {"code": 421, "msg": "no free instance", "data": refusal, **counts}
    )
    again = (await bridge.next(timeout=2.0))["data"]
    assert (again["taskId"], again["attempt"]) == ("r1", first["attempt"] + 1)
    assert env.service.hub is not None
    assert env.service.hub.registry.bridges["br1"].slots.withheld == 0
    await bridge.ws.close()
    await client.close()


async def test_a_refusal_saying_every_instance_is_busy_withholds_until_a_report(
    env: Env,
) -> None:
    """A 421 with counts saying nothing is free: the slot is busy by the bridge's word, and
    freed by its next report (here a HEARTBEAT)."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("r2"))
    first = (await bridge.next())["data"]
    refusal = {"taskId": "r2", "attempt": first["attempt"]}
    full = {"instanceCount": 1, "availableInstanceCount": 0}
    await bridge.send("TASK_ACK", {"code": 421, "msg": "busy", "data": refusal, **full})
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.3)
    await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1})
    assert (await bridge.next())["data"]["taskId"] == "r2"
    await bridge.ws.close()
    await client.close()


async def test_a_task_past_its_deadline_on_the_bridge_holding_it_is_not_claimed_in_a_loop(
    env: Env,
) -> None:
    """The sweeper retries a bridge task past its deadline while its bridge still holds the
    old attempt: the hub must not pick that bridge again (its ledger refuses the task) and
    requeue it at once, ~1,500 claims a second (issue 24, item 8). It waits with a back-off,
    or goes to another bridge."""
    hub = env.service.hub
    assert hub is not None
    bridge = await env.bridge()
    await bridge.register(count=2)
    client = await env.client()
    await client.request(generate("late"))
    assign = (await bridge.next())["data"]
    await bridge.ack("late")
    task = await until(lambda: env.task("late"), lambda t: t.state == TaskState.RUNNING)
    # what the sweeper does at the deadline of a task on our own GPUs
    assert await env.service.lifecycle.retry_or_fail(
        "late",
        aigc=task.aigc,
        platform=task.platform,
        attempt=assign["attempt"],
        charged=task.charged,
        reason="deadline passed on bridge (running)",
    )
    await asyncio.sleep(1.0)
    before = (await env.task("late")).attempt
    await asyncio.sleep(2.0)
    claims = (await env.task("late")).attempt - before
    assert claims <= 6, f"{claims} claims in 2 s"
    print(f"claims of a task its bridge still holds: {claims} in 2 s")
    assert hub.registry.bridges["br1"].slots.holds("late")
    # another bridge with a free slot gets it
    other = await env.bridge()
    await other.register("br2", count=1)
    got = (await other.next(timeout=3.0))["data"]
    assert got["taskId"] == "late"
    for ws in (bridge.ws, other.ws):
        await ws.close()
    await client.close()


async def test_a_cancelled_tasks_slot_waits_for_the_bridges_capacity_report(env: Env) -> None:
    """A bridge that sends CAPACITY (REGISTER ``capacityReports``): after a cancel its slot
    is offered again only when it reports the instance free; a report older than one
    applied changes nothing (issue 24, item 2). A seed bridge's is free at once (see
    test_bridge_slots)."""
    hub = env.service.hub
    assert hub is not None
    bridge = await env.bridge()
    await bridge.register(count=1, capacityReports=True)
    client = await env.client()
    await client.request(generate("c1"))
    assert (await bridge.next())["data"]["taskId"] == "c1"
    await bridge.ack("c1")
    await until(lambda: env.task("c1"), lambda t: t.state == TaskState.RUNNING)
    await client.request(generate("c2"))
    assert (await client.request({"type": "cancel", "taskId": "c1"}))["type"] == "cancelled"
    assert (await bridge.next())["type"] == "TASK_CANCEL"
    with pytest.raises(TimeoutError):  # its instance is still stopping the prompt
        await bridge.next(timeout=0.5)
    stopping = {"instanceCount": 1, "availableInstanceCount": 0, "tasks": ["c1"]}
    await bridge.send("CAPACITY", {"seq": 2, **stopping})
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.3)
    free = {"instanceCount": 1, "availableInstanceCount": 1, "tasks": []}
    await bridge.send("CAPACITY", {"seq": 1, **free})  # older than the one applied
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.3)
    await bridge.send("CAPACITY", {"seq": 3, **free})
    nxt = await bridge.next(timeout=2.0)
    assert (nxt["type"], nxt["data"]["taskId"], nxt["data"]["attempt"]) == ("TASK_ASSIGN", "c2", 1)
    await bridge.ws.close()
    await client.close()
