"""The bridge hub in-process against a real Redis, driven by a bridge written with websockets."""

from __future__ import annotations

import asyncio
import json
import logging
from functools import partial
from typing import Any

import orjson
import pytest
import websockets
from redis import exceptions as redis_errors

from aigcq.bridges.hub import HubConfig
from aigcq.config import Settings
from aigcq.observability.jsonlog import JsonFormatter
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.bridge import BRIDGE_TOKEN, task_end
from tests.fakes.client import Client, generate
from tests.fakes.service import SECRET, Env, env
from tests.fakes.snapshot import redis_snapshot
from tests.fakes.waiting import until, wait_until

__all__ = ["env"]  # a fixture: imported for pytest to find


async def test_assigns_free_slots_only_and_delivers_the_result(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=2)
    client = await env.client()
    for i in range(3):
        await client.request(generate(f"t{i}"))
    assigns = [await bridge.next(), await bridge.next()]
    assert [a["type"] for a in assigns] == ["TASK_ASSIGN", "TASK_ASSIGN"]
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.5)  # no third: both slots are taken
    first = assigns[0]["data"]
    assert first["workflowId"] and first["attempt"] == 1 and first["webhookUrl"]
    for a in assigns:
        await bridge.ack(a["data"]["taskId"])
    await until(lambda: env.task(first["taskId"]), lambda t: t.state == "running")
    assert await task_end(env, first["webhookUrl"]) == 200
    result = await client.next()
    assert result["type"] == "result" and result["taskId"] == first["taskId"]
    assert await task_end(env, first["webhookUrl"]) == 200  # a repeat: taken, changes nothing
    await bridge.send("HEARTBEAT", {"instanceCount": 2, "availableInstanceCount": 1})
    third = await bridge.next()
    assert third["type"] == "TASK_ASSIGN"
    assert third["data"]["taskId"] not in {a["data"]["taskId"] for a in assigns}
    await bridge.ws.close()
    await client.close()


async def test_closing_the_bridge_before_ack_requeues_its_tasks(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=2)
    client = await env.client()
    for i in range(2):
        await client.request(generate(f"c{i}"))
    ids = [(await bridge.next())["data"]["taskId"] for _ in range(2)]
    await bridge.ws.close()
    for task_id in ids:
        task = await until(partial(env.task, task_id), lambda t: t.state == "pending")
        assert (task.attempt, task.charged) == (1, 0)  # uncharged: the bridge never ran it
    assert env.service.hub is not None and env.service.hub.free_slots() == 0
    await client.close()


async def test_task_end_overtaking_its_ack_frees_the_slot(env: Env) -> None:
    """TASK_END comes over HTTP, TASK_ACK over the socket: a quick task's TASK_END can be
    handled first. The slot is freed all the same, and the late ACK is dropped quietly."""
    hub = env.service.hub
    assert hub is not None
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("fast-1"))
    assign = await bridge.next()
    assert await task_end(env, assign["data"]["webhookUrl"]) == 200  # before any TASK_ACK
    assert (await client.next())["status"] == "success"
    assert hub.free_slots() == 1
    await bridge.ack("fast-1")
    with pytest.raises(TimeoutError):  # no ERROR frame for it
        await bridge.next(timeout=0.3)
    await client.request(generate("fast-2"))  # the slot is really free
    assert (await bridge.next())["data"]["taskId"] == "fast-2"
    await bridge.ws.close()
    await client.close()


async def test_a_heartbeat_racing_a_task_end_does_not_count_the_slot_twice(env: Env) -> None:
    """The bridge ends a task and reports it free in a HEARTBEAT that the hub handles before
    the task's TASK_END (HTTP and the socket race): the TASK_END must not free it again."""
    hub = env.service.hub
    assert hub is not None
    bridge = await env.bridge()
    await bridge.register(count=2)
    client = await env.client()
    for i in range(2):
        await client.request(generate(f"race-{i}"))
    assigns = [(await bridge.next())["data"] for _ in range(2)]
    for a in assigns:
        await bridge.ack(a["taskId"])
    await until(lambda: env.task(assigns[1]["taskId"]), lambda t: t.state == "running")
    await bridge.send("HEARTBEAT", {"instanceCount": 2, "availableInstanceCount": 1})

    await wait_until(lambda: hub.free_slots() == 1)
    assert await task_end(env, assigns[0]["webhookUrl"]) == 200
    assert (await client.next())["taskId"] == assigns[0]["taskId"]
    assert hub.free_slots() == 1  # the other task still runs
    await bridge.ws.close()
    await client.close()


async def test_refused_ack_gives_the_task_back_for_another_try(env: Env) -> None:
    """A refused task goes back to the head of the queue; the bridge's slot stays taken
    until its next HEARTBEAT (it refused for a reason: handing the task straight back
    would loop), then the task is tried again."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("r1"))
    first = await bridge.next()
    await bridge.ack("r1", code=421)
    await until(lambda: env.task("r1"), lambda t: t.state == "pending")
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.3)
    await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1})
    again = await bridge.next()
    assert again["type"] == "TASK_ASSIGN" and again["data"]["taskId"] == "r1"
    # a new attempt (its own webhook URL), not charged: the bridge refused it
    assert again["data"]["attempt"] == first["data"]["attempt"] + 1
    assert (await env.task("r1")).charged == 1
    third = await bridge.next(timeout=3.0)  # no ACK at all: the hub times out and retries
    assert third["data"]["taskId"] == "r1"
    await bridge.ws.close()
    await client.close()


async def test_reregister_requeues_acked_tasks_the_bridge_no_longer_holds(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate("h1"))
    await bridge.next()
    await bridge.ack("h1")
    await until(lambda: env.task("h1"), lambda t: t.state == "running")
    await bridge.ws.close()
    # the hub has handled the close (it saves the offline record after any requeue)
    await until(lambda: env.redis.hget("aigcq:bridge:br1", "online"), lambda v: v == "0")
    assert (await env.task("h1")).state == "running"  # acked: waits for its TASK_END
    bridge = await env.bridge()
    await bridge.register(count=1, availableInstanceCount=0, tasks=[])
    await until(lambda: env.task("h1"), lambda t: t.state == "pending")
    await bridge.ws.close()
    await client.close()


async def test_a_lost_reply_while_re_adopting_held_tasks_forgets_none_of_them(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge reconnects listing both its tasks and the reply to the hub's refresh of
    their record is lost: when it reconnects again holding neither, both are requeued (the
    record was taken before the refresh, so they waited for their deadline)."""
    bridge = await env.bridge()
    await bridge.register(count=2)
    client = await env.client()
    for task_id in ("h1", "h2"):
        await client.request(generate(task_id))
        await bridge.next()
        await bridge.ack(task_id)
        await until(partial(env.task, task_id), lambda t: t.state == "running")
    held = env.service.rt.store.keys.bridge_tasks("br1")
    await until(lambda: env.redis.hlen(held), lambda n: n == 2)
    await bridge.ws.close()
    mux = env.service.rt.store.mux
    real = mux.commands
    lost: list[Any] = []

    async def lose_reply(*commands: Any) -> list[Any]:
        replies = await real(*commands)
        if not lost and any(str(c[1]).endswith(":tasks") for c in commands):
            lost.append(commands)
            raise redis_errors.ConnectionError("reply lost")
        return replies

    monkeypatch.setattr(mux, "commands", lose_reply)
    bridge = await env.bridge()
    await bridge.register(count=2, availableInstanceCount=0, tasks=["h1", "h2"])
    await wait_until(lambda: lost)
    await bridge.ws.close()
    bridge = await env.bridge()
    await bridge.register(count=2, availableInstanceCount=0, tasks=[])
    for task_id in ("h1", "h2"):
        await until(partial(env.task, task_id), lambda t: t.state == "pending")
    await bridge.ws.close()
    await client.close()


BAD_FRAMES: list[tuple[str, str]] = [
    ("{not json", "JSONError"),
    ('{"type": "EXPLODE", "data": {}}', "UnknownType"),
    ('{"type": "TASK_ASSIGN", "data": {}}', "UnknownType"),
    ('{"type": "REGISTER", "data": {"bridgeId": "br1"}}', "InvalidMessage"),
    ('{"type": "TASK_ACK", "data": {"code": 0, "data": {"taskId": "nope"}}}', "UnknownTask"),
    # issue 15 item 14: nested 5,000 deep (RecursionError dropped the bridge)
    ('{"type": "HEARTBEAT", "data": ' + "[" * 5000 + "]" * 5000 + "}", "JSONError"),
]


@pytest.mark.parametrize(("raw", "code"), BAD_FRAMES)
async def test_bad_bridge_input_gets_an_error_and_changes_nothing(
    env: Env, raw: str, code: str
) -> None:
    bridge = await env.bridge()
    await bridge.register(count=1)
    await until(lambda: env.redis.exists("aigcq:bridge:br1"), bool)
    before = await redis_snapshot(env.redis)
    await bridge.ws.send(raw)
    reply = await bridge.next()
    assert reply == {"type": "ERROR", "data": {"code": code, "msg": reply["data"]["msg"]}}
    assert await redis_snapshot(env.redis) == before
    assert env.service.hub is not None and env.service.hub.free_slots() == 1
    await bridge.ws.send(raw)  # still connected
    assert (await bridge.next())["data"]["code"] == code
    await bridge.ws.close()


async def test_wrong_token_is_closed_with_4401(env: Env) -> None:
    bridge = await env.bridge(token="forged")
    assert (await bridge.next())["data"]["code"] == "AuthError"
    assert await bridge.close_code() == 4401
    bridge = await env.bridge(token=None)
    await bridge.register(token="forged")
    assert (await bridge.next())["data"]["code"] == "AuthError"
    assert await bridge.close_code() == 4401
    assert env.service.hub is not None and env.service.hub.free_slots() == 0


async def test_token_in_register_is_accepted(env: Env) -> None:
    bridge = await env.bridge(token=None)
    await bridge.register(count=3, token=BRIDGE_TOKEN)
    hub = env.service.hub
    assert hub is not None
    await wait_until(lambda: hub.free_slots() == 3)
    await bridge.ws.close()


async def test_a_message_flood_is_closed_with_4008(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=1)
    frame = orjson.dumps({"type": "PONG"}).decode()
    with pytest.raises(websockets.ConnectionClosed):
        for _ in range(500):
            await bridge.ws.send(frame)
        await bridge.next()
    assert bridge.ws.close_code == 4008


async def test_missed_heartbeats_take_the_bridge_offline(env: Env) -> None:
    hub = env.service.hub
    assert hub is not None
    hub.config = HubConfig(ping_interval_s=0.05, heartbeat_interval_s=0.1, ack_timeout_s=1.0)
    bridge = await env.bridge()
    await bridge.register(count=2)
    assert await bridge.close_code() == 4000
    assert hub.free_slots() == 0
    saved = await env.redis.hgetall("aigcq:bridge:br1")
    assert saved["online"] == "0" and saved["instanceCount"] == "2"


async def test_progress_reaches_the_client_rate_limited(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = Client(env.port, "b1", issue_client_token(SECRET, "b1"))
    client.url += "&progress=1"  # progress messages are opt-in
    env.sockets.append((await client.connect()).ws)
    await client.request(generate("p1"))
    assert (await bridge.next())["type"] == "TASK_ASSIGN"
    await bridge.ack("p1")
    running = await client.next()
    assert running == {"type": "progress", "taskId": "p1", "state": "running", "target": "bridge"}
    for step in range(1, 6):  # a burst: only the first gets through
        await bridge.send("TASK_PROGRESS", {"taskId": "p1", "value": step, "max": 20, "node": "3"})
    first = await client.next()
    assert first == {"type": "progress", "taskId": "p1", "value": 1, "max": 20, "node": "3"}
    with pytest.raises(TimeoutError):
        await client.next(timeout=0.3)
    await asyncio.sleep(0.3)  # time: past the 0.5 s interval
    named = {"taskId": "p1", "value": 9, "max": 20, "node": "3", "nodeName": "KSampler"}
    await bridge.send("TASK_PROGRESS", named)  # the node's name: relayed as it came
    assert await client.next() == {"type": "progress", **named}


async def test_hub_log_lines_carry_task_and_bridge_ids(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aigcq")
    bridge = await env.bridge()
    await bridge.register("br-log", count=1)
    client = await env.client()
    await client.request(generate("lg1"))
    assign = await bridge.next()
    assert assign["data"]["taskId"] == "lg1"
    await bridge.ack("lg1")
    await until(partial(env.task, "lg1"), lambda t: t.state == "running")

    def acked() -> bool:
        return any("task lg1 acknowledged" in r.getMessage() for r in caplog.records)

    await wait_until(acked)  # logged after one more write

    def about(text: str) -> logging.LogRecord:
        return next(r for r in caplog.records if text in r.getMessage())

    registered = about("bridge br-log: registered")
    assert registered.__dict__.get("bridgeId") == "br-log" and "taskId" not in registered.__dict__
    for text in ("task lg1 assigned", "task lg1 acknowledged"):
        line = json.loads(JsonFormatter().format(about(text)))
        assert (line["taskId"], line["bridgeId"]) == ("lg1", "br-log")
    await bridge.ws.close()
    await client.close()


async def test_the_flood_limit_is_a_setting_and_a_flood_changes_nothing_else(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIGCQ_BRIDGE_MAX_MSGS_PER_S", "20")
    assert Settings(_env_file=None).bridge_max_msgs_per_s == 20  # type: ignore[call-arg]
    hub = env.service.hub
    assert hub is not None
    env.service.rt.settings.bridge_max_msgs_per_s = 20  # read at each connection
    calm, noisy = await env.bridge(), await env.bridge()
    await calm.register("calm", count=1)
    await noisy.register("noisy", count=2)
    await wait_until(lambda: hub.free_slots() == 3)
    unknown_ack = {"code": 0, "msg": "ok", "data": {"taskId": "nope"}}
    pong = orjson.dumps({"type": "PONG"}).decode()
    for _ in range(12):  # with REGISTER and the ACK: 14 frames, under the limit in any second
        await noisy.ws.send(pong)
    await noisy.send("TASK_ACK", unknown_ack)
    assert (await noisy.next())["data"]["code"] == "UnknownTask"  # still served

    before = await redis_snapshot(env.redis)
    with pytest.raises(websockets.ConnectionClosed):
        for _ in range(100):
            await noisy.ws.send(pong)
        await noisy.next()
    assert noisy.ws.close_code == 4008
    await wait_until(lambda: hub.free_slots() == 1)
    after = await redis_snapshot(env.redis)
    record = "aigcq:bridge:noisy"  # the one change: its own record says it went offline
    assert after.keys() == before.keys()
    assert {k: v for k, v in after.items() if k != record} == {
        k: v for k, v in before.items() if k != record
    }
    assert (await env.redis.hgetall(record))["online"] == "0"
    assert (await env.redis.hgetall("aigcq:bridge:calm"))["online"] == "1"
    await calm.send("TASK_ACK", unknown_ack)  # the other bridge is untouched
    assert (await calm.next())["data"]["code"] == "UnknownTask"
    await calm.ws.close()
