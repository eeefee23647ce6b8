"""Issue 42 item 10: a bridge task past its run deadline is retried, and the attempt that
timed out is stopped on its bridge (TASK_CANCEL, which interrupts the prompt). Its
instance is offered again only when the bridge reports it free, and the retry then runs
there. A real service and a bridge speaking the protocol over a real socket."""

from __future__ import annotations

import pytest

from aigcq.domain import TaskState
from tests.fakes.client import generate
from tests.fakes.service import Env, env
from tests.fakes.waiting import until

__all__ = ["env"]  # a fixture: imported for pytest to find


async def test_a_timed_out_attempt_is_cancelled_on_its_bridge(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=1, capacityReports=True)
    client = await env.client()
    await client.request(generate("d1"))
    assert (await bridge.next())["data"]["taskId"] == "d1"
    await bridge.ack("d1")
    await until(lambda: env.task("d1"), lambda t: t.state == TaskState.RUNNING)
    keys = env.service.rt.store.keys  # its run deadline is now (what a long run would do)
    await env.redis.hset(keys.task("d1"), "deadline", 1)
    await env.redis.zadd(keys.inflight, {"d1": 1}, xx=True)
    await env.service.sweeper._expire("d1")
    stop = await bridge.next()
    assert stop == {"type": "TASK_CANCEL", "data": {"taskId": "d1", "attempt": 1}}
    with pytest.raises(TimeoutError):  # its instance is still stopping the prompt
        await bridge.next(timeout=1.5)
    free = {"instanceCount": 1, "availableInstanceCount": 1, "tasks": []}
    await bridge.send("CAPACITY", {"seq": 2, **free})
    retry = await bridge.next(timeout=10.0)
    assert (retry["type"], retry["data"]["taskId"], retry["data"]["attempt"]) == (
        "TASK_ASSIGN",
        "d1",
        2,
    )
