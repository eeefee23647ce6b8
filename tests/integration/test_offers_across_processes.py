"""What the bridges of every process can run (found against real ComfyUI, issue 24): with
two serve processes, each holding a bridge, a task that no bridge of the cluster can run
(a node class none of their instances has) waited for ever: each process left it to the
other's bridges. It fails ``NoCapableInstance`` at once, as with one process; a task only
the other process's bridge can run is left to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.bridges.hub import BridgeHub
from tests.fakes.bridge import Bridge
from tests.fakes.client import generate
from tests.fakes.service import Env, Pair, serve_pair
from tests.fakes.waiting import wait_until

BASIC = ["EmptyImage", "SaveImage"]


@pytest.fixture
async def pair(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Pair]:
    async with serve_pair(tmp_path, redis, redis_url, concurrency=0) as p:  # no paid platform
        yield p


def hub_of(env: Env) -> BridgeHub:
    hub = env.service.hub
    assert hub is not None
    return hub


async def describing(env: Env, bridge_id: str, classes: list[str], *, seen_by: Env) -> Bridge:
    """A bridge with one idle instance offering ``classes``, counted by ``seen_by``."""
    bridge = await env.bridge()
    instance = {"instanceId": "i0", "url": "http://i0", "state": "idle", "nodeClasses": classes}
    await bridge.register(bridge_id, count=1, instances=[instance])
    await wait_until(lambda: hub_of(seen_by).peers.bridges_elsewhere >= 1)
    return bridge


def graph(node_class: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1}},
        "2": {"class_type": node_class, "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
    }


async def test_a_task_no_bridge_of_the_cluster_can_run_fails_at_once(pair: Pair) -> None:
    await describing(pair.a, "br-a", BASIC, seen_by=pair.b)
    await describing(pair.b, "br-b", BASIC, seen_by=pair.a)
    client = await pair.a.client()
    await client.request(generate("odd", workflowId="odd", workflow=graph("NoSuchNode")))
    await client.collect(1, timeout=10)
    failed = client.results["odd"][0]
    assert failed["status"] == "failed"
    # no bridge of the cluster offers it: the client's mistake (issue 42 item 11)
    assert failed["error"]["code"] == "UnknownNodeClass"
    assert failed["error"]["detail"]["class"] == "task"
    assert failed["error"]["detail"]["nodeClasses"] == ["NoSuchNode"]


async def test_a_task_only_the_other_process_bridge_can_run_goes_there(pair: Pair) -> None:
    await describing(pair.a, "br-a", BASIC, seen_by=pair.b)
    inverting = await describing(pair.b, "br-b", [*BASIC, "ImageInvert"], seen_by=pair.a)
    client = await pair.a.client()
    await client.request(generate("inv", workflowId="inv", workflow=graph("ImageInvert")))
    msg = await inverting.next(timeout=10)
    assert (msg["type"], msg["data"]["taskId"]) == ("TASK_ASSIGN", "inv")
