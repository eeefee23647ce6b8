"""Peers written for the seed's Node.js services, against the hub and gateway on a real Redis
(issue 30 item 4): what JavaScript coerced is read the same way, every other form is still
refused naming its field, and a refusal changes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fakes.bridge import task_end
from tests.fakes.client import generate
from tests.fakes.service import Env, env
from tests.fakes.snapshot import redis_snapshot
from tests.fakes.waiting import until

__all__ = ["env"]  # a fixture: imported for pytest to find

WORKFLOW = {"workflowId": "1904136902449209346", "nodeInfoList": []}


async def test_a_node_bridge_and_client_run_a_task_with_coerced_fields(env: Env) -> None:
    """Counts as digit strings, an integer taskId, a payload sent as JSON text."""
    bridge = await env.bridge()
    await bridge.send(
        "REGISTER", {"bridgeId": "node", "instanceCount": "1", "availableInstanceCount": "0"}
    )
    client = await env.client()
    submit = generate("x") | {"taskId": 1910246754753896450, "payload": json.dumps(WORKFLOW)}
    reply = await client.request(submit)
    assert reply["type"] == "submitted" and reply["taskId"] == "1910246754753896450"
    task = await env.task("1910246754753896450")
    assert task.payload == WORKFLOW  # stored as the object, as if sent as one
    beat = {"instanceCount": "1", "availableInstanceCount": "1", "busyInstanceCount": "0"}
    await bridge.send("HEARTBEAT", beat)
    assign = await bridge.next()
    assert assign["type"] == "TASK_ASSIGN"
    assert assign["data"]["workflowId"] == WORKFLOW["workflowId"]
    await bridge.send(
        "TASK_ACK",
        {"code": 0, "msg": "success", "data": {"taskId": 1910246754753896450, "attempt": 1}},
    )
    await until(lambda: env.task("1910246754753896450"), lambda t: t.state == "running")
    assert await task_end(env, assign["data"]["webhookUrl"]) == 200
    result = await client.next()
    assert result["type"] == "result" and result["taskId"] == "1910246754753896450"
    cancel = await client.request({"type": "cancel", "taskId": 1910246754753896450})
    assert cancel["code"] == "TaskGone" and cancel["taskId"] == "1910246754753896450"  # found
    await client.close()


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"taskId": 1.5}, "taskId: "),
        ({"taskId": True}, "taskId: "),
        ({"payload": "[1, 2]"}, "payload: "),
        ({"payload": "{not json"}, "payload: "),
        ({"payload": 5}, "payload: "),
    ],
)
async def test_other_forms_are_still_json_errors_naming_the_field(
    env: Env, fields: dict[str, Any], detail: str
) -> None:
    client = await env.client()
    before = await redis_snapshot(env.redis)
    reply = await client.request(generate("t") | fields)
    assert reply["type"] == "error" and reply["code"] == "JSONError"
    assert reply["detail"].startswith(detail)
    assert await redis_snapshot(env.redis) == before
    await client.close()


async def test_a_heartbeat_with_a_bad_count_is_refused_and_changes_nothing(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register("node", count=1)
    await until(lambda: env.redis.exists("aigcq:bridge:node"), bool)
    before = await redis_snapshot(env.redis)
    await bridge.send("HEARTBEAT", {"instanceCount": "1", "availableInstanceCount": "one"})
    error = await bridge.next()
    assert error["type"] == "ERROR" and error["data"]["code"] == "InvalidMessage"
    assert error["data"]["msg"].startswith("HEARTBEAT data.availableInstanceCount: ")
    assert await redis_snapshot(env.redis) == before
    assert env.service.hub is not None and env.service.hub.free_slots() == 1
