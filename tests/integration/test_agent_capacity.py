"""The reference bridge tells aigcq its capacity as it is (issue 24): every refusal carries
its current counts, so the hub need not guess."""

from __future__ import annotations

from aigcq.agent.app import Bridge
from tests.fakes.agent_hub import Env, assign_three_to_two, env

__all__ = ["env"]  # a fixture: imported for pytest to find

__all__ = ["env"]


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
