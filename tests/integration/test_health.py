"""Health (seed 000 §8) in-process against a real Redis: degrade on bridge loss, overflow to
the RunningHub emulator at once, recover after 3 passing checks; failing bridges."""

from __future__ import annotations

import asyncio
import contextlib
import operator
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.bridges import assigner
from aigcq.bridges.hub import HubConfig
from aigcq.config import PlatformConfig, Settings
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from aigcq.health import HealthState
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge, instances_with, task_end
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import model_graph
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET, Env
from tests.fakes.waiting import until, wait_until

INTERVAL_S = 0.25


@pytest.fixture
async def env(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Env]:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 5}}}')
    emulator = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    async with serve_app(create_app(emulator)) as rh:
        settings = Settings(
            redis_url=redis_url,
            token_secret=SECRET,
            config_dir=tmp_path,
            bridge_token=BRIDGE_TOKEN,
            runninghub_url=rh,
            health_interval_s=INTERVAL_S,
            bridge_quarantine_s=0.3,
        )
        service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
        async with serve_app(service.app) as base:
            env = Env(int(base.rsplit(":", 1)[1]), redis, service)
            yield env
            for ws in env.sockets:
                await ws.close()


async def health(env: Env) -> dict[str, Any]:
    return dict(await env.redis.hgetall("md:state:health"))


def status(expected: HealthState) -> Any:
    return lambda h: h.get("status") == expected.value


async def goes_to(env: Env, client: Client, task_id: str, target: str) -> None:
    """Submit ``task_id`` and wait (at most 1 s) until it is dispatched to ``target``."""
    await client.request(generate(task_id))
    task = await until(partial(env.task, task_id), lambda t: t.target != "", within=1.0)
    assert task.target == target


async def assign(bridge: Bridge) -> str:
    msg = await bridge.next()
    assert msg["type"] == "TASK_ASSIGN"
    await bridge.ack(msg["data"]["taskId"])
    return str(msg["data"]["webhookUrl"])


async def test_bridge_loss_degrades_at_once_and_a_silent_bridge_takes_three_checks(
    env: Env,
) -> None:
    hub = env.service.hub
    assert hub is not None
    # the seed's fallback at once: with a grace, tasks wait for a bridge whose socket
    # closed (a restart, see test_bridge_restart), and health still degrades at once
    env.service.rt.settings.bridge_grace_s = 0
    bridge = await env.bridge()
    await bridge.register(count=2)
    await until(lambda: health(env), lambda h: h.get("status") == "healthy", within=2.0)
    assert (await env.redis.hgetall("md:state:connection"))["status"] == "connected"
    capacity = await env.redis.hgetall("md:state:capacity")
    assert capacity["totalBridges"] == "1" and capacity["totalInstances"] == "2"
    assert await env.redis.ttl("md:state:capacity") > 0
    assert await env.redis.get("md:state:last_heartbeat")
    client = await env.client()
    await goes_to(env, client, "in-1", "bridge")
    await assign(bridge)

    await bridge.ws.close()
    await wait_until(lambda: not hub.healthy, 1.0)
    await goes_to(env, client, "out-1", "runninghub")
    state = await until(lambda: health(env), status(HealthState.DEGRADED), within=1.0)
    assert state["reason"] == "no bridge connected" and state["degradeCount"] == "1"
    connection = await env.redis.hgetall("md:state:connection")
    assert connection["status"] == "disconnected" and connection["disconnectedAt"]

    # A bridge that goes silent (no HEARTBEAT for two 0.1 s intervals) is capacity that
    # failed: back, it waits for the stability period.
    hub.config = HubConfig(heartbeat_interval_s=0.1, missed_heartbeats=2, ping_interval_s=60)
    quiet = await env.bridge()
    await quiet.register("br2", count=2)  # new: usable at once
    await until(lambda: env.redis.hget("aigcq:bridge:br2", "left"), partial(operator.eq, "silent"))
    hub.config = HubConfig()
    back = await env.bridge()
    await back.register("br2", count=2)
    await wait_until(lambda: "br2" in hub.registry.bridges)
    assert not hub.healthy and hub.free_slots() == 0  # back, but not stable yet
    await goes_to(env, client, "out-2", "runninghub")
    await until(lambda: health(env), status(HealthState.RECOVERING), within=1.0)
    state = await until(lambda: health(env), status(HealthState.HEALTHY), within=2.0)
    assert state["recoverCount"] == "2" and state["degradeCount"] == "2"
    await goes_to(env, client, "in-2", "bridge")
    await client.close()


async def test_a_known_bridge_that_reconnects_is_usable_at_once(env: Env) -> None:
    """A socket that blipped is not capacity that failed: no 3-check stability period."""
    hub = env.service.hub
    assert hub is not None
    bridge = await env.bridge()
    await bridge.register(count=2)
    await wait_until(lambda: hub.healthy, 2.0)
    client = await env.client()
    await bridge.ws.close()
    await wait_until(lambda: not hub.healthy, 1.0)
    hub.health.interval_s = 60  # no periodic check from now on could make it healthy
    bridge = await env.bridge()
    await bridge.register(count=2)
    await wait_until(lambda: hub.free_slots() == 2, 2.0)
    await goes_to(env, client, "after-blip", "bridge")
    await assign(bridge)
    await client.close()


async def test_the_first_bridge_of_a_server_started_without_one_is_used_at_once(
    env: Env,
) -> None:
    hub = env.service.hub
    assert hub is not None
    state = await until(lambda: health(env), status(HealthState.DEGRADED), within=2.0)
    assert state["reason"] == "no bridge connected"
    client = await env.client()
    await goes_to(env, client, "early", "runninghub")  # nothing internal to run it on

    hub.health.interval_s = 60  # no periodic check from now on could make it healthy
    await asyncio.sleep(2 * INTERVAL_S)  # time: two periodic rounds pass while degraded
    bridge = await env.bridge()
    await bridge.register(count=2)
    # no stability period: this capacity has never failed
    await wait_until(lambda: hub.free_slots(), 2.0)
    assert hub.healthy
    await goes_to(env, client, "first", "bridge")
    await assign(bridge)
    await client.close()


async def test_a_bridge_whose_tasks_keep_failing_is_out_of_rotation_until_a_probe(
    env: Env,
) -> None:
    hub = env.service.hub
    assert hub is not None
    bridge = await env.bridge()
    await bridge.register(count=1)
    await until(lambda: health(env), status(HealthState.HEALTHY), within=2.0)
    client = await env.client()
    for i in range(3):
        await goes_to(env, client, f"f{i}", "bridge")
        hook = await assign(bridge)
        await until(partial(env.task, f"f{i}"), lambda t: t.state == "running")
        assert await task_end(env, hook, code=1) == 200
        await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1})
    await wait_until(lambda: hub.free_slots() == 0, 1.0)
    state = await until(lambda: health(env), status(HealthState.DEGRADED), within=1.0)
    assert state["reason"] == "every bridge is out of rotation"
    assert (await env.redis.hgetall("aigcq:bridge:br1"))["inRotation"] == "0"
    await goes_to(env, client, "f-out", "runninghub")

    await asyncio.sleep(0.3)  # time: the 0.3 s cool-down; then a free HEARTBEAT re-admits
    await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1})
    await until(lambda: health(env), status(HealthState.HEALTHY), within=2.0)
    await goes_to(env, client, "f-back", "bridge")
    await client.close()


@contextlib.asynccontextmanager
async def second_process(
    env: Env, config_dir: Path
) -> AsyncIterator[tuple[ServeProcess, Env, Bridge, Client]]:
    """A second aigcq process on the same Redis (configured from ``config_dir``), and a
    bridge of one instance connected to the first; yields (service, its Env, bridge,
    client of the first)."""
    settings = env.service.rt.settings.model_copy(update={"config_dir": config_dir})
    other = ServeProcess(settings, PlatformConfig.load(config_dir), env.redis)
    async with serve_app(other.app) as other_base:
        elsewhere = Env(int(other_base.rsplit(":", 1)[1]), env.redis, other)
        bridge = await env.bridge()
        await bridge.register(count=1)
        await until(lambda: health(env), status(HealthState.HEALTHY), within=2.0)
        yield other, elsewhere, bridge, await env.client()


async def test_failures_reported_to_another_process_count_for_the_bridge(
    env: Env, tmp_path: Path
) -> None:
    """Two aigcq processes on one Redis: the bridge is connected to the first, its TASK_ENDs
    arrive at the second. The count is shared; the second tells the first at once (and the
    first would also apply it at the next HEARTBEAT)."""
    hub = env.service.hub
    assert hub is not None
    other_dir = tmp_path / "other"  # a process that never overflows (no external slots)
    other_dir.mkdir()
    (other_dir / "model.json").write_text(
        '{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}'
    )
    async with second_process(env, other_dir) as (_, elsewhere, bridge, client):
        beat = {"instanceCount": 1, "availableInstanceCount": 1}
        for i in range(3):
            await goes_to(env, client, f"x{i}", "bridge")
            hook = await assign(bridge)
            await until(partial(env.task, f"x{i}"), lambda t: t.state == "running")
            assert await task_end(elsewhere, hook, code=1) == 200
            failures = str(i + 1)  # counted by the other process, after its answer
            await until(
                lambda: env.redis.hget("aigcq:bridge:br1", "failures"),
                partial(operator.eq, failures),
            )
            if i < 2:
                assert await env.redis.hget("aigcq:bridge:br1", "inRotation") == "1"
            await bridge.send("HEARTBEAT", beat)
        conn = hub.registry.bridges["br1"]
        await wait_until(lambda: conn.failures == 3, 1.0)
        assert conn.quarantined_at is not None and hub.free_slots() == 0  # though 1 is free
        await until(
            lambda: env.redis.hget("aigcq:bridge:br1", "inRotation"), partial(operator.eq, "0")
        )
        await goes_to(env, client, "x-out", "runninghub")

        await asyncio.sleep(0.3)  # time: the 0.3 s cool-down; on probation, then a success
        await bridge.send("HEARTBEAT", beat)
        await until(lambda: health(env), status(HealthState.HEALTHY), within=2.0)
        assert (await env.redis.hget("aigcq:bridge:br1", "failures")) == "2"
        await goes_to(env, client, "x-back", "bridge")
        hook = await assign(bridge)
        await until(partial(env.task, "x-back"), lambda t: t.state == "running")
        assert await task_end(elsewhere, hook) == 200
        await until(
            lambda: env.redis.hget("aigcq:bridge:br1", "failures"), partial(operator.eq, "0")
        )
        await bridge.send("HEARTBEAT", beat)
        await wait_until(lambda: conn.failures == 0, 1.0)
        assert conn.quarantined_at is None
        await client.close()


async def test_a_task_end_received_elsewhere_frees_the_slot_at_once(
    env: Env, tmp_path: Path
) -> None:
    """The bridge (1 instance) is connected to the first process, its TASK_END reaches the
    second: the first frees the slot now, not at the next HEARTBEAT, so the next task
    runs on the bridge instead of overflowing to RunningHub."""
    hub = env.service.hub
    assert hub is not None
    async with second_process(env, tmp_path) as (other, elsewhere, bridge, client):
        assert other.hub is not None
        for i in range(3):
            # The second process sees the first's free slot within 0.2 s; from then on it
            # leaves the task to it rather than overflow.
            await wait_until(lambda: other.hub.free_elsewhere() == 1)  # type: ignore[union-attr]
            await goes_to(env, client, f"e{i}", "bridge")
            hook = await assign(bridge)
            await until(partial(env.task, f"e{i}"), lambda t: t.state == "running")
            assert hub.free_slots() == 0
            # The second process has seen the slot taken, so its wait for 1 at the top of
            # the next round is for this slot's release, not a view older than this task.
            await wait_until(lambda: other.hub.free_elsewhere() == 0)  # type: ignore[union-attr]
            assert await task_end(elsewhere, hook) == 200  # no HEARTBEAT follows
            await wait_until(lambda: hub.free_slots() == 1, 1.0)
        # The second process has no bridge: md:state:* is left to the one that has.
        for _ in range(8):
            assert (await health(env))["status"] == HealthState.HEALTHY.value
            await asyncio.sleep(INTERVAL_S / 2)  # time: healthy at every half interval
        await client.close()


async def test_overflow_after_ms_holds_overflow_while_internal_is_healthy(env: Env) -> None:
    env.service.rt.settings.overflow_after_ms = 400
    bridge = await env.bridge()
    await bridge.register(count=1)
    await until(lambda: health(env), status(HealthState.HEALTHY), within=2.0)
    client = await env.client()
    await goes_to(env, client, "w-in", "bridge")
    await client.request(generate("w-out"))
    await asyncio.sleep(0.2)  # time: nothing happens before overflow_after_ms (0.4 s)
    assert (await env.task("w-out")).state == "pending"  # internal is busy but healthy
    task = await until(partial(env.task, "w-out"), lambda t: t.target != "", within=1.0)
    assert task.target == "runninghub"
    await client.close()


async def test_a_task_no_bridge_here_can_run_waits_for_other_processes_then_overflows(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes, each with a bridge that lacks the task's model: neither claims it
    again and again (a back-off between claims), and it goes to RunningHub once it has
    waited for the other process's bridges (ELSEWHERE_WAIT_S)."""
    monkeypatch.setattr(assigner, "ELSEWHERE_WAIT_S", 1.0, raising=False)
    settings = env.service.rt.settings.model_copy(update={"config_dir": tmp_path})
    other = ServeProcess(settings, PlatformConfig.load(tmp_path), env.redis)
    async with serve_app(other.app) as other_base:
        there = await Bridge.connect(int(other_base.rsplit(":", 1)[1]))
        here = await env.bridge()
        for bridge, name in ((here, "here"), (there, "there")):
            await bridge.register(name, count=1, instances=instances_with("a.safetensors"))
        for service in (env.service, other):
            hub = service.hub
            assert hub is not None
            await wait_until(lambda h=hub: h.peers.bridges_elsewhere)
        client = await env.client()
        task_id = "needs-c"
        await client.request(generate(task_id, workflow=model_graph("c.safetensors")))
        task = await until(partial(env.task, task_id), lambda t: t.target == "runninghub", 15)
        assert task.attempt <= 10  # a few claims, not a loop
        for bridge in (here, there):
            with pytest.raises(TimeoutError):
                await bridge.next(timeout=0.1)
        await there.ws.close()
        await client.close()


async def test_each_instance_is_published_under_the_seeds_key(env: Env) -> None:
    """Seed 000 §8.3's ``md:state:instances[:{instanceId}]`` (60 s TTL), from what a bridge
    reports of its instances."""
    bridge = await env.bridge()
    instances = [
        {"instanceId": "i0", "url": "http://i0", "state": "busy", "taskId": "t1"},
        {"instanceId": "i1", "url": "http://i1", "state": "offline"},
    ]
    await bridge.register(count=2, instances=instances)
    one = await until(
        lambda: env.redis.hgetall("md:state:instances:i0"), lambda h: bool(h), within=3.0
    )
    assert (one["bridgeId"], one["status"], one["currentTaskId"]) == ("br1", "busy", "t1")
    assert one["currentTaskStartTime"] and one["lastUpdated"]
    assert await env.redis.ttl("md:state:instances:i0") > 0
    index = await env.redis.hgetall("md:state:instances")
    assert sorted(index) == ["i0", "i1"]
    assert '"status":"offline"' in index["i1"]


async def test_a_seed_bridge_s_instances_are_published_as_bridge_id_and_number(env: Env) -> None:
    """A seed-format bridge reports counts only (no per-instance list): its instances are
    ``{bridgeId}-{n}``, busy with its tasks first, so seed 000 §8.1.1's keys exist for
    every bridge (issue 41 §2)."""
    bridge = await env.bridge()
    await bridge.register("seed", count=3)
    await (await env.client()).request(generate("s1"))
    assign = await bridge.next()
    await bridge.ack(assign["data"]["taskId"])

    async def index() -> dict[str, str]:
        found: dict[str, str] = await env.redis.hgetall("md:state:instances")
        return found

    found = await until(index, lambda i: '"currentTaskId":"s1"' in i.get("seed-1", ""), 5.0)
    assert sorted(found) == ["seed-1", "seed-2", "seed-3"]
    first = await env.redis.hgetall("md:state:instances:seed-1")
    assert (first["bridgeId"], first["status"], first["currentTaskId"]) == ("seed", "busy", "s1")
    idle = await env.redis.hgetall("md:state:instances:seed-3")
    assert (idle["status"], idle["currentTaskId"]) == ("online", "")
    assert await env.redis.ttl("md:state:instances:seed-2") > 0
