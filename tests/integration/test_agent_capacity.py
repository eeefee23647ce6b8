"""The reference bridge tells aigcq its capacity as it is (issue 24): every refusal carries
its current counts, so the hub need not guess."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from aigcq.agent.app import Bridge
from tests.fakes.agent_hub import Env, assign_three_to_two, env
from tests.fakes.comfyui import GRAPH

__all__ = ["env"]  # a fixture: imported for pytest to find

VIEW_S = 2.0


async def test_every_refusal_carries_the_bridges_counts(env: Env) -> None:
    async with Bridge(env.settings):
        acks = await assign_three_to_two(env)
        assert {t: a["code"] for t, a in acks.items()} == {"a": 0, "b": 0, "c": 421}
        busy = acks["c"]
        assert (busy["instanceCount"], busy["availableInstanceCount"]) == (2, 0)
        assert sorted(i["taskId"] for i in busy["instances"]) == ["a", "b"]
        assert sorted(busy["tasks"]) == ["a", "b"]
        assert "instanceCount" not in acks["a"]  # a code 0 is as the seed has it
        await env.hub.send("TASK_ASSIGN", env.assign("unknown", workflowId="no-such"))
        missing = await env.hub.next("TASK_ACK")
        assert missing["code"] == 380 and missing["instanceCount"] == 2
        assert (await env.end_for("a"))["code"] == 0
        assert (await env.end_for("b"))["code"] == 0


@pytest.mark.parametrize("slow", ["view_latency", "history_latency"])
async def test_an_instance_takes_the_next_task_while_the_last_ones_result_is_read(
    env: Env, slow: str
) -> None:
    """ComfyUI is free once a prompt ended (its WebSocket says so); reading its history
    entry (slow on a loaded ComfyUI) or fetching its outputs (slow over a slow link) must
    not keep the GPU idle: CAPACITY says the instance is free before, and the next task
    runs there before the last one's TASK_END."""
    for emulator in env.emulators:
        setattr(emulator.config, slow, VIEW_S)

    async def upto(type_: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while True:
                message = await env.hub.inbox.get()
                if message["type"] == type_ and done(message.get("data", {})):
                    return message.get("data", {})

    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        for task_id in ("a", "b"):
            await env.hub.send("TASK_ASSIGN", env.assign(task_id, workflow=GRAPH))
        await upto("CAPACITY", lambda c: c["availableInstanceCount"] > 0)
        await env.hub.send("TASK_ASSIGN", env.assign("c", workflow=GRAPH))
        ack = await upto("TASK_ACK", lambda a: a["data"]["taskId"] == "c")
        assert ack["code"] == 0
        for task_id in ("a", "b", "c"):
            assert (await env.end_for(task_id))["code"] == 0
    # c ran on the instance that ran a or b: it started before that one's result could
    # have been read (/view or /history answers VIEW_S after the prompt ended)
    (before, after), _ = sorted((list(e.config.gpu.spans) for e in env.emulators), key=len)[::-1]
    assert after[0] - before[1] < VIEW_S
