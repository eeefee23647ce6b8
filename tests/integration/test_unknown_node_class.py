"""Issue 42 item 11: a workflow with a node class no bridge of the cluster offers (nor one
that left within its grace) is the client's mistake: it fails with a client-error class
(``task``), the missing class named, and no "try later". A class that exists, on an
instance that lacks only a model, is not (``NoCapableInstance``, as before)."""

from __future__ import annotations

from typing import Any

from tests.fakes.bridge import Bridge, instances_with
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import model_graph
from tests.fakes.service import Env, env

__all__ = ["env"]  # a fixture: imported for pytest to find


def with_node(task_id: str, class_type: str) -> dict[str, Any]:
    graph = model_graph("a.safetensors") | {"10": {"class_type": class_type, "inputs": {}}}
    return generate(task_id, workflow=graph)


async def failed(client: Client, task_id: str) -> dict[str, Any]:
    result = await client.next(timeout=10)
    assert (result["taskId"], result["status"]) == (task_id, "failed")
    return result


async def registered(env: Env) -> Bridge:
    bridge = await env.bridge()
    await bridge.register("gpu", count=1, instances=instances_with("a.safetensors"))
    return bridge


async def test_a_node_class_no_bridge_offers_is_the_clients_mistake(env: Env) -> None:
    await registered(env)
    client = await env.client()
    await client.request(with_node("u1", "NoSuchNode"))
    error = (await failed(client, "u1"))["error"]
    assert error["code"] == "UnknownNodeClass"
    assert error["detail"]["class"] == "task"
    assert error["detail"]["nodeClasses"] == ["NoSuchNode"]  # the missing one only
    assert error["message"] == env.service.rt.config.messages.get("UnknownNodeClass")
    assert "稍后再试" not in error["message"]
    got = (await env.service.rt.store.reads.get("u1")).failure  # type: ignore[union-attr]
    assert got == {"class": "task", "code": "UnknownNodeClass", "message": error["message"]}


async def test_a_model_no_instance_has_is_still_no_capable_instance(env: Env) -> None:
    await registered(env)
    client = await env.client()
    await client.request(generate("m1", workflow=model_graph("z.safetensors")))
    error = (await failed(client, "m1"))["error"]
    assert error["code"] == "NoCapableInstance"
