"""After a Redis master change the hub records again what its bridges run: a new master that
lost the last writes (here: the bridge's tasks record and the task's claim, removed by
hand) gets the bridge's truth back, and the task Redis has at an older attempt is named."""

from __future__ import annotations

import logging

import pytest

from tests.fakes.client import generate
from tests.fakes.service import Env, env
from tests.fakes.waiting import until

__all__ = ["env"]  # a fixture: imported for pytest to find


async def test_the_hub_records_its_bridges_tasks_again_after_a_master_change(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = await env.bridge()
    await bridge.register(bridge_id="br1", count=1)
    client = await env.client()
    await client.request(generate("m1"))
    assign = await bridge.next()
    await bridge.ack("m1")
    await until(lambda: env.task("m1"), lambda t: t.state == "running")
    keys, hub = env.service.rt.store.keys, env.service.hub
    assert hub is not None
    # what a failover to a replica that missed the last writes looks like
    await env.redis.delete(keys.bridge_tasks("br1"))
    await env.redis.hset(keys.task("m1"), mapping={"attempt": 0, "status": "pending"})
    with caplog.at_level(logging.WARNING, logger="aigcq.bridges.hub"):
        await hub.after_master_change()
    assert await env.redis.hgetall(keys.bridge_tasks("br1")) == {
        "m1": str(assign["data"]["attempt"])
    }
    assert "task m1: bridge br1 runs attempt 1; after the master change Redis has pending" in (
        caplog.text
    )
    await client.close()
