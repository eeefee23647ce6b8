"""The capacity feed (seed 000 §7) against a real dispatcher: its messages and their
structure, a change reaching ``aigcq serve`` at once, and polling while the feed is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
import websockets

import tests.fakes.message_dispatcher as mds
from aigcq.dispatcher.auth import DispatcherAuth
from aigcq.dispatcher.capacity import FeedConfig
from aigcq.mdclient.feed_messages import FEED_PATH
from aigcq.mdclient.target import MessageDispatcherTarget
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import Bridge
from tests.fakes.client import Client, generate
from tests.fakes.waiting import wait_until

md = mds.md  # the dispatcher fixture
fast_checks = mds.fast_checks


class Feed:
    """A backend's end of the feed, reading frames in order."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def connect(cls, md: mds.Md, token: str | None) -> Feed:
        query = f"?token={token}" if token else ""
        return cls(await websockets.connect(f"ws://127.0.0.1:{md.port}{FEED_PATH}{query}"))

    async def send(self, kind: str, **data: Any) -> None:
        await self.ws.send(orjson.dumps({"type": kind, "data": data}).decode())

    async def until(self, kind: str, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Frames up to and including the next ``kind``."""
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout):
            while not seen or seen[-1]["type"] != kind:
                seen.append(orjson.loads(await self.ws.recv()))
        return seen


def _kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


async def test_connect_needs_a_valid_jwt(md: mds.Md) -> None:
    feed = await Feed.connect(md, None)
    await feed.send("CONNECT", clientId="x")
    assert (await feed.until("ERROR"))[-1]["data"]["code"] == "AuthError"
    with pytest.raises(websockets.ConnectionClosed):
        await feed.ws.recv()
    assert feed.ws.close_code == 4401


async def test_a_silent_backend_is_closed(md: mds.Md) -> None:
    md.dispatcher.feed.config = FeedConfig(heartbeat_s=0.2, heartbeat_timeout_s=0.1)
    feed = await Feed.connect(md, await md.token())
    await feed.send("CONNECT")
    await feed.until("CAPACITY_UPDATE")
    with pytest.raises(websockets.ConnectionClosed):
        await feed.until("NEVER", timeout=3)
    assert feed.ws.close_code == 4000
    assert not md.dispatcher.feed.subscribers


async def test_feed_messages_and_their_structure(md: mds.Md) -> None:
    md.dispatcher.feed.config = FeedConfig(interval_s=0.5, change_check_s=0.05)
    token = await md.token()
    feed = await Feed.connect(md, token)
    await feed.send("CONNECT", clientId="backend-1", timestamp="2024-01-01T00:00:00.000Z")
    ack, first = await feed.until("CAPACITY_UPDATE")
    assert ack["type"] == "CONNECT_ACK" and ack["data"]["serverId"] == "message-dispatcher"
    assert first["data"]["bridges"] == [] and first["data"]["summary"]["totalInstances"] == 0
    await feed.send("HEARTBEAT")
    assert (await feed.until("HEARTBEAT_ACK"))[-1]["data"]["timestamp"].endswith("Z")

    bridge = await Bridge.connect(md.port)
    await bridge.register(count=2)
    # periodic CAPACITY_UPDATEs (every 0.5 s) come between the news too: read updates until
    # both INSTANCE_ONLINE came and the last update counts the bridge
    frames: list[dict[str, Any]] = []
    for _ in range(20):
        frames += await feed.until("CAPACITY_UPDATE")
        counted = frames[-1]["data"]["summary"]["totalInstances"] == 2
        if counted and _kinds(frames).count("INSTANCE_ONLINE") >= 2:
            break
    news = [k for k in _kinds(frames) if k != "CAPACITY_UPDATE"]
    assert news == ["INSTANCE_ONLINE", "INSTANCE_ONLINE"]
    data = frames[-1]["data"]
    assert data["summary"] == {
        "totalBridges": 1,
        "totalInstances": 2,
        "onlineInstances": 2,
        "busyInstances": 0,
        "availableCapacity": 2,
        "healthy": True,
    }
    (row,) = data["bridges"]
    assert row["bridgeId"] == "br1" and row["connectedAt"]
    assert row["instances"][0] == {"instanceId": "br1#0", "status": "online", "currentTask": None}

    resp = await md.http.post("/api/task", json={**mds.BODY, "apiKey": token})
    task_id = resp.json()["data"]["taskId"]
    assign = await bridge.next()
    # a periodic CAPACITY_UPDATE may come first: the news is INSTANCE_BUSY, then its update
    (*_, busy_now) = await feed.until("INSTANCE_BUSY")
    assert busy_now["data"]["taskId"] == task_id
    busy = await feed.until("CAPACITY_UPDATE")
    current = busy[-1]["data"]["bridges"][0]["instances"][0]["currentTask"]
    assert current["taskId"] == task_id and current["startTime"]
    await bridge.ack(task_id)
    await mds.md_task_end(md, assign["data"]["webhookUrl"])
    idle = await feed.until("INSTANCE_IDLE")
    assert idle[-1]["data"]["instanceId"] == "br1#0"
    assert idle[-1]["data"]["completedTaskId"] == task_id

    await feed.send("TASK_ALLOCATION", allocatedTasks=[{"taskId": "t-9", "targetInstance": None}])
    assert (await feed.until("TASK_ALLOCATION_ACK"))[-1]["data"]["accepted"] == 1
    assert md.dispatcher.feed.allocations["t-9"]["clientId"] == "backend-1"
    await feed.send("NONSENSE")
    assert (await feed.until("ERROR"))[-1]["data"]["code"] == "InvalidMessage"
    assert _kinds(await feed.until("CAPACITY_UPDATE", timeout=2)) == ["CAPACITY_UPDATE"]

    await bridge.ws.close()
    gone = await feed.until("CAPACITY_UPDATE")
    offline = [f["data"] for f in gone if f["type"] == "INSTANCE_OFFLINE"]
    assert len(offline) == 2 and offline[0]["reason"] == "disconnected"
    assert gone[-1]["data"]["summary"]["totalBridges"] == 0
    await feed.ws.close()


def _target(service: ServeProcess) -> MessageDispatcherTarget:
    target = service.internal
    assert isinstance(target, MessageDispatcherTarget)
    return target


@pytest.fixture
async def fed(
    md: mds.Md,
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[MessageDispatcherTarget, Client]]:
    """serve in the split topology, its capacity feed connected: (its internal target,
    a client). One health check only, so free slots change through the feed alone."""
    monkeypatch.setenv("MESSAGE_DISPATCHER_HEALTH_CHECK_INTERVAL", "600000")
    monkeypatch.setenv("MD_PASSWORD", mds.PASSWORD)
    async with mds.serve_split(tmp_path, redis, redis_url, md.base) as (service, client):
        target = _target(service)
        await wait_until(lambda: target.feed.connected)
        yield target, client


async def test_capacity_change_reaches_serve_at_once(
    md: mds.Md, fed: tuple[MessageDispatcherTarget, Client]
) -> None:
    md.dispatcher.feed.config = FeedConfig(change_check_s=0.05)
    target, client = fed
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=2)
    await wait_until(lambda: target.free_slots() == 2, 1)
    await client.request(generate("feed-1"))
    assign = await bridge.next()
    md_task_id = assign["data"]["taskId"]
    allocations = md.dispatcher.feed.allocations
    await wait_until(lambda: md_task_id in allocations)
    await bridge.ws.close()
    await wait_until(lambda: target.free_slots() == 0, 1)


async def test_quick_tasks_still_resync_serves_free_slots(
    md: mds.Md, fed: tuple[MessageDispatcherTarget, Client]
) -> None:
    """serve counts a slot as taken when it submits. A task that starts and ends between
    two of the dispatcher's checks leaves its summary unchanged; the accepted task alone
    must still push an update, or serve sees no free slot until the periodic one (10 s)
    and sends the next tasks to paid platforms."""
    md.dispatcher.feed.config = FeedConfig(change_check_s=0.5, interval_s=60)
    target, client = fed
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    await wait_until(lambda: target.free_slots() == 1, 2)
    for i in range(3):
        await client.request(generate(f"quick-{i}"))
        assign = await bridge.next()
        await bridge.ack(assign["data"]["taskId"])
        await mds.md_task_end(md, assign["data"]["webhookUrl"])
        assert (await client.next())["status"] == "success"
        await wait_until(lambda: target.free_slots() == 1, 2)


@pytest.mark.usefixtures("fast_checks")
async def test_feed_down_falls_back_to_polling(
    md: mds.Md, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    feed = md.dispatcher.feed
    async with mds.serve_split(tmp_path, redis, redis_url, md.base) as (service, _client):
        target = _target(service)
        await wait_until(lambda: target.feed.connected)
        auth, feed.auth = feed.auth, DispatcherAuth("admin", mds.PASSWORD, "x" * 40, 60)
        for sub in list(feed.subscribers):
            await sub.ws.close()
        await wait_until(lambda: not target.feed.connected)
        bridge = await Bridge.connect(md.port)
        await bridge.register(count=3)
        await wait_until(lambda: target.free_slots() == 3)  # from GET /api/health
        feed.auth = auth
        await wait_until(lambda: target.feed.connected, 10)  # reconnected
        await bridge.ws.close()


async def test_refused_token_logs_in_again_at_once(
    md: mds.Md,
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MD_PASSWORD", mds.PASSWORD)
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    async with mds.serve_split(tmp_path, redis, redis_url, md.base) as (service, client):
        target = _target(service)
        await wait_until(lambda: target.free_slots() == 1)
        old = target.jwt.current()
        md.dispatcher.auth.secret = "rotated-secret-with-at-least-32-bytes-of-key"
        await client.request(generate("relogin-1"))
        assign = await bridge.next(timeout=10)  # the retry, with a fresh token
        assert assign["type"] == "TASK_ASSIGN"
        assert target.jwt.current() not in (None, old)
    await bridge.ws.close()


async def test_serves_health_metrics_are_its_own_view_of_the_dispatcher(
    fed: tuple[MessageDispatcherTarget, Client], redis: aioredis.Redis
) -> None:
    target, client = fed
    await wait_until(lambda: target.health_view.proven)
    target.health_view.observe("message-dispatcher unreachable", immediate=True)
    assert (await redis.hgetall("md:state:health")).get("status") != "degraded"  # its own view
    port = client.url.split(":")[2].split("/")[0]
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    assert 'aigcq_internal_health{state="degraded"} 1.0' in text
    assert "aigcq_internal_degrades_total 1.0" in text
