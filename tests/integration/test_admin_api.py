"""The admin API in-process against a real Redis: auth, the SSE snapshot, drain, retry."""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.bridge import task_end
from tests.fakes.client import generate
from tests.fakes.service import ADMIN, SECRET, Env, admin_env, admin_service
from tests.fakes.waiting import until

__all__ = ["admin_env"]  # a fixture: imported for pytest to find

ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
def env(admin_env: Env) -> Env:
    return admin_env


async def first_event(http: httpx.AsyncClient, count: int = 1) -> list[dict[str, Any]]:
    """The first ``count`` snapshots of the event stream."""
    events: list[dict[str, Any]] = []
    async with http.stream("GET", "/api/admin/events", headers=ADMIN_HEADERS) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(orjson.loads(line[6:]))
                if len(events) == count:
                    return events
    raise AssertionError("the event stream ended")


async def snapshot(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/api/admin/snapshot", headers=ADMIN_HEADERS)
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


def bridge_row(snap: dict[str, Any], bridge_id: str = "br1") -> dict[str, Any]:
    return next(b for b in snap["bridges"] if b["bridgeId"] == bridge_id)


async def test_every_admin_call_needs_the_admin_token(env: Env) -> None:
    client = {"Authorization": f"Bearer {issue_client_token(SECRET, 'b1')}"}
    async with httpx.AsyncClient(base_url=env.base) as http:
        for headers in ({}, client, {"Authorization": "Bearer wrong"}):
            assert (await http.get("/api/admin/snapshot", headers=headers)).status_code == 401
            assert (await http.get("/api/admin/events", headers=headers)).status_code == 401
            assert (await http.get("/api/admin/pauses", headers=headers)).status_code == 401
            for path in (
                *("/api/admin/bridges/br1/drain", "/api/admin/tasks/x/retry"),
                *("/api/admin/pause", "/api/admin/resume"),
                *("/api/admin/tasks/cancel", "/api/admin/tasks/replay"),
            ):
                body = {"kind": "project", "name": "proj", "project": "proj"}
                assert (await http.post(path, headers=headers, json=body)).status_code == 401
        page = await http.get("/dashboard")  # the page itself holds no data
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert (await http.get("/dashboard/dashboard.js")).status_code == 200
        assert (await http.get("/dashboard/secrets.txt")).status_code == 404


async def test_the_event_stream_pushes_snapshots_every_second(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=2)
    async with httpx.AsyncClient(base_url=env.base, timeout=10) as http:
        first, second = await first_event(http, count=2)
    assert set(first) == {
        *("time", "bridges", "queues", "split", "trends", "health", "recent"),
        *("overflow", "spend", "asynch", "pauses"),  # asynch: None without AIGCQ_ASYNCH_URL
        *("accounts", "budgets", "shares", "capacity"),
    }
    assert first["pauses"] == []
    assert first["asynch"] is None
    assert 0.5 < second["time"] - first["time"] < 3
    row = bridge_row(second)
    assert row["online"] and row["instances"] == 2 and row["free"] == 2
    assert not row["drained"] and row["inRotation"] and row["lastHeartbeat"] > 0
    assert second["queues"] == [
        {
            "AIGC": "proj",
            "platform": "comfyui",
            "waiting": 0,
            "inFlight": {"bridge": 0, "runninghub": 0},
            "capacity": {"bridge": 2, "runninghub": 0},
            "oldestWaitS": 0.0,
            "heldBy": [],  # nothing holds its work
        }
    ]
    assert second["health"]["state"] == "healthy"
    assert set(second["split"]["totals"]) == {"internal", "external"}
    [point] = second["trends"]["history"]  # one every 10 s
    assert point["waiting"] == 0 and point["inFlight"] == 0 and point["spend"] == 0
    assert second["trends"]["latency"] == {"p50": None, "p99": None, "tasks": 0}


async def test_a_client_token_sees_bridge_work_capacity_and_oldest_wait(env: Env) -> None:
    """``GET /api/queues`` and ``aigcq status`` with a client token: the bridge's task is in
    flight, the bridge's slots are capacity, and the waiting task's age is shown."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    token = issue_client_token(SECRET, "b1")
    async with httpx.AsyncClient(base_url=env.base) as http:
        await client.request(generate("q1"))
        await bridge.next()
        await client.request(generate("q2"))
        headers = {"Authorization": f"Bearer {token}"}
        row = (await until(partial(http.get, "/api/queues", headers=headers),
                           lambda r: r.json()[0]["waiting"] == 1)).json()[0]  # fmt: skip
    assert row["inFlight"] == {"bridge": 1, "runninghub": 0}
    assert row["capacity"] == {"bridge": 1, "runninghub": 0}
    assert row["oldestWaitS"] >= 0.0
    args = ["status", "--server", env.base, "--token", token]
    out = (await asyncio.to_thread(CliRunner().invoke, app, args)).stdout
    assert "bridge:1" in out and "capacity" in out, out
    assert " s " in out.split("recent tasks")[0], out  # oldest wait, not "-"
    await client.close()


async def test_status_and_snapshot_show_each_instances_device_and_vram(env: Env) -> None:
    gib = 2**30
    instances = [
        {"instanceId": "gpu-a:8188", "url": "http://gpu-a:8188", "state": "idle",
         "device": "NVIDIA L4", "vramTotal": 24 * gib, "vramFree": 6 * gib},
        {"instanceId": "gpu-b:8188", "url": "http://gpu-b:8188", "state": "offline"},
    ]  # fmt: skip
    bridge = await env.bridge()
    await bridge.register(count=2, instances=instances)
    async with httpx.AsyncClient(base_url=env.base) as http:
        snap = await until(partial(snapshot, http), lambda s: bool(s["bridges"]))
    first, second = bridge_row(snap)["instanceStates"]
    assert (first["device"], first["vramTotal"], first["vramFree"]) == (
        "NVIDIA L4",
        24 * gib,
        6 * gib,
    )
    assert (second["state"], second["device"]) == ("offline", None)
    args = ["status", "--server", env.base, "--token", ADMIN]
    run = partial(CliRunner().invoke, app, args, env={"COLUMNS": "400"})
    out = (await asyncio.to_thread(run)).stdout
    assert "gpu-a:8188 idle (NVIDIA L4, 6.0/24.0 GiB free), gpu-b:8188 offline" in out, out


async def test_status_watch_writes_each_round_when_piped(env: Env) -> None:
    token = issue_client_token(SECRET, "b1")
    args = ["status", "--watch", "--interval", "0.1", "--server", env.base, "--token", token]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aigcq", *args, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        rounds = [await asyncio.wait_for(proc.stdout.readuntil(b"recent tasks"), 20)]
        rounds.append(await asyncio.wait_for(proc.stdout.readuntil(b"recent tasks"), 20))
    finally:
        proc.terminate()
        await proc.wait()
    assert all(b"queues" in r and b"--- " in r for r in rounds), rounds


async def test_a_drained_bridge_gets_no_new_tasks_but_finishes_its_own(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=2)
    client = await env.client()
    async with httpx.AsyncClient(base_url=env.base) as http:
        await client.request(generate("d1"))
        assign = await bridge.next()
        await bridge.ack("d1")
        r = await http.post("/api/admin/bridges/br1/drain", headers=ADMIN_HEADERS)
        assert r.json() == {"bridgeId": "br1", "drained": True, "connected": True, "known": True}
        await client.request(generate("d2"))
        with pytest.raises(TimeoutError):
            await bridge.next(timeout=0.5)
        snap = await until(partial(snapshot, http), lambda s: s["queues"][0]["waiting"] == 1)
        row = bridge_row(snap)
        assert row["drained"] and row["free"] == 0 and row["running"] == ["d1"]
        assert await task_end(env, assign["data"]["webhookUrl"]) == 200  # still accepted
        await until(
            partial(snapshot, http), lambda s: s["split"]["totals"]["internal"] == 1, within=5
        )
        await http.post("/api/admin/bridges/br1/undrain", headers=ADMIN_HEADERS)
        again = await bridge.next()
        assert again["type"] == "TASK_ASSIGN" and again["data"]["taskId"] == "d2"
    await client.close()


async def test_a_drained_bridge_stays_drained_when_it_reconnects(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.base) as http:
        r = await http.post("/api/admin/bridges/br9/drain", headers=ADMIN_HEADERS)
        assert r.json()["connected"] is False
        bridge = await env.bridge()
        await bridge.register("br9", count=1)
        row = bridge_row(await until(partial(snapshot, http), lambda s: s["bridges"]), "br9")
        assert row["drained"] and row["free"] == 0
        assert env.service.hub is not None and env.service.hub.free_slots() == 0


async def test_retry_queues_a_cancelled_task_for_a_new_attempt(env: Env) -> None:
    client = await env.client()
    await client.request(generate("r1"))
    async with httpx.AsyncClient(base_url=env.base) as http:
        retry = "/api/admin/tasks/r1/retry"
        conflict = await http.post(retry, headers=ADMIN_HEADERS)
        assert conflict.status_code == 409  # still pending
        missing = await http.post("/api/admin/tasks/nope/retry", headers=ADMIN_HEADERS)
        assert missing.status_code == 404
        await http.post("/api/tasks/r1/cancel", headers=ADMIN_HEADERS)
        assert (await env.task("r1")).state == "cancelled"
        r = await http.post(retry, headers=ADMIN_HEADERS)
        assert r.json() == {"taskId": "r1", "state": "pending"}
        assert await env.redis.ttl(env.service.rt.store.keys.task("r1")) == -1
        bridge = await env.bridge()
        await bridge.register(count=1)
        assign = await bridge.next()
        assert assign["data"]["taskId"] == "r1" and assign["data"]["attempt"] == 1
        timeline = (await http.get("/api/tasks/r1", headers=ADMIN_HEADERS)).json()["timeline"]
        assert [e["state"] for e in timeline] == ["pending", "cancelled", "pending", "dispatching"]
        assert timeline[2]["note"] == "retried by an operator"
    await client.close()


async def test_the_snapshot_shows_each_projects_gpu_share(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """model.json ``share`` (issue 37): min, max and weight beside what runs on our GPUs."""
    models = {"proj": {"share": {"min": 1, "max": 2, "weight": 3}, "comfyui": {"concurrency": 0}}}
    service = admin_service(tmp_path, redis, redis_url, orjson.dumps(models).decode())
    async with service as env, httpx.AsyncClient(base_url=f"http://127.0.0.1:{env.port}") as http:
        snap = await snapshot(http)
    assert snap["shares"] == [{"AIGC": "proj", "min": 1, "max": 2, "weight": 3.0, "running": 0}]
