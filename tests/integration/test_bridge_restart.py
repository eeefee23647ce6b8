"""Issue 42 item 1: a routine bridge restart neither fails nor pays its tasks.

A bridge whose socket closes keeps what it offered (node classes, models, slots) for
``AIGCQ_BRIDGE_GRACE_S``, in Redis (any serve process sees it): a task only it can run
waits for it instead of failing ``NoCapableInstance`` or going to the paid platform, and
runs on it when it is back, through whichever process it reconnects to. Only once the
grace is over does such a task fail (or overflow). Bridges speak the real protocol over
real sockets; two serve processes share one Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.domain import TaskState
from tests.fakes.bridge import Bridge, instances_with
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import model_graph
from tests.fakes.service import SECRET, Env, env, serve_pair
from tests.fakes.waiting import until

__all__ = ["env"]  # a fixture: imported for pytest to find


def needing(task_id: str, ckpt: str) -> dict[str, Any]:
    return generate(task_id, workflow=model_graph(ckpt))


async def client_of(e: Env) -> Client:
    from aigcq.plumbing.auth import issue_client_token

    client = await Client(e.port, "b1", issue_client_token(SECRET, "b1")).connect()
    e.sockets.append(client.ws)
    return client


async def gone(bridge: Bridge, e: Env) -> None:
    """The bridge's socket closes (its process restarts); until the hub has let it go."""
    await bridge.ws.close()
    hub = e.service.hub
    assert hub is not None
    await until(lambda: _ids(e), lambda ids: "gpu" not in ids)


async def _ids(e: Env) -> set[str]:
    assert e.service.hub is not None
    return {c.bridge_id for c in e.service.hub.registry.live()}


async def test_a_task_only_a_restarting_bridge_runs_waits_for_it(
    env: Env, redis: aioredis.Redis
) -> None:
    """Another bridge is connected (it cannot run the task); the one that can restarts."""
    other = await env.bridge()
    await other.register("other", count=2, instances=instances_with("a.safetensors"))
    gpu = await env.bridge()
    await gpu.register("gpu", count=1, instances=instances_with("a.safetensors", "b.safetensors"))
    await gone(gpu, env)
    client = await env.client()
    await client.request(needing("needs-b", "b.safetensors"))
    with pytest.raises(TimeoutError):  # time: no NoCapableInstance while it restarts
        await client.next(timeout=1.5)
    back = await env.bridge()
    await back.register("gpu", count=1, instances=instances_with("a.safetensors", "b.safetensors"))
    assign = await back.next()
    assert (assign["type"], assign["data"]["taskId"]) == ("TASK_ASSIGN", "needs-b")


async def test_a_task_fails_once_the_grace_is_over(env: Env) -> None:
    env.service.rt.settings.bridge_grace_s = 1.0
    other = await env.bridge()
    await other.register("other", count=2, instances=instances_with("a.safetensors"))
    gpu = await env.bridge()
    await gpu.register("gpu", count=1, instances=instances_with("a.safetensors", "b.safetensors"))
    await gone(gpu, env)
    client = await env.client()
    await client.request(needing("late-b", "b.safetensors"))
    result = await client.next(timeout=10)
    assert (result["taskId"], result["status"]) == ("late-b", "failed")
    assert result["error"]["code"] == "NoCapableInstance"


async def test_a_restart_onto_another_process_is_not_paid(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The only bridge leaves process a and comes back to process b; a task submitted
    meanwhile (to b) waits for it: RunningHub has room, yet creates nothing."""
    async with serve_pair(tmp_path, redis, redis_url) as p:
        gpu = await p.a.bridge()
        await gpu.register("gpu", count=1, instances=instances_with("a.safetensors"))
        await until(lambda: _ids(p.a), lambda ids: "gpu" in ids)
        await gone(gpu, p.a)
        client = await client_of(p.b)
        await client.request(needing("t1", "a.safetensors"))
        await asyncio.sleep(1.5)  # time: a paid create would be out by now
        assert (await p.b.task("t1")).state is TaskState.PENDING
        back = await p.b.bridge()
        await back.register("gpu", count=1, instances=instances_with("a.safetensors"))
        assign = await back.next()
        assert (assign["type"], assign["data"]["taskId"]) == ("TASK_ASSIGN", "t1")
        assert await p.paid_creates() == 0
