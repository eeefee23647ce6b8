"""Issue 6: SIGTERM to a real ``aigcq serve`` hands its work back and exits 0; after a
restart every result reaches the client exactly once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
import websockets

from aigcq.domain import Task, TaskState
from aigcq.queue.store import TaskStore
from tests.fakes.client import Client, generate
from tests.fakes.processes import BRIDGE_TOKEN, Cluster, Proc
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.e2e

TASKS = 8
SLOTS = 2  # instances of the test's bridge, which never acknowledges
RH_CAP = 3
EXIT_BOUND_S = 5.0


class SilentBridge:
    """A bridge that registers and takes TASK_ASSIGNs but never sends TASK_ACK: its tasks
    are exactly the "assigned, not acknowledged" work a shutdown must hand back."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.assigned: list[str] = []

    @classmethod
    async def connect(cls, port: int, bridge_id: str, slots: int) -> SilentBridge:
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/ws?token={BRIDGE_TOKEN}")
        data = {"bridgeId": bridge_id, "instanceCount": slots, "availableInstanceCount": slots}
        await ws.send(orjson.dumps({"type": "REGISTER", "data": data}).decode())
        return cls(ws)

    async def read(self) -> None:
        """Record TASK_ASSIGNs until the server closes the connection."""
        try:
            async for raw in self.ws:
                msg = orjson.loads(raw)
                if msg["type"] == "TASK_ASSIGN":
                    self.assigned.append(msg["data"]["taskId"])
        except websockets.ConnectionClosed:
            pass


async def tasks(store: TaskStore, ids: list[str]) -> dict[str, Task]:
    out = {}
    for task_id in ids:
        task = await store.reads.get(task_id)
        assert task is not None, f"{task_id} lost"
        out[task_id] = task
    return out


async def terminate(proc: Proc, timeout: float) -> tuple[int, float]:
    """SIGTERM ``proc``; its exit code and how long it took. Waits without blocking the
    event loop, so the test's WebSockets can answer the server's close handshake."""
    assert proc.p is not None
    start = time.monotonic()
    proc.p.terminate()
    try:
        await wait_until(lambda: proc.p is not None and proc.p.poll() is not None, timeout, 0.05)
    except AssertionError:
        proc.kill()
        pytest.fail(f"serve still running {timeout:.0f} s after SIGTERM")
    return proc.p.returncode, time.monotonic() - start


async def test_sigterm_hands_work_back_and_every_result_arrives_once(cluster: Cluster) -> None:
    rh = cluster.emulator("runninghub", "--max-concurrent", str(RH_CAP), "--duration", "3")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": RH_CAP}}})

    def serve(port: int | None = None) -> tuple[Proc, int]:
        # A task whose TASK_END came while no server listened ends by its deadline.
        return cluster.server(port, AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_TASK_DEADLINE_S="8")

    server, port = serve()
    redis = aioredis.Redis.from_url(cluster.redis_url, decode_responses=True)
    store = TaskStore(redis, "aigcq", retention_s=3600, outbox_retention_s=3600)
    ids = [f"g-{i}" for i in range(TASKS)]
    try:
        bridge = await SilentBridge.connect(port, "br-graceful", SLOTS)
        reader = asyncio.create_task(bridge.read())
        client = await Client(port, "biz-graceful").connect()
        for task_id in ids:
            reply = await client.request(generate(task_id))
            assert reply["type"] == "submitted", reply

        async def in_flight() -> bool:
            states = [t.state for t in (await tasks(store, ids)).values()]
            running = states.count(TaskState.RUNNING)
            return len(bridge.assigned) == SLOTS and running == RH_CAP

        await wait_until(in_flight, 15.0, 0.05)
        before = await tasks(store, ids)
        on_bridge = set(bridge.assigned)
        on_rh = {t.task_id for t in before.values() if t.state is TaskState.RUNNING}
        assert on_bridge.isdisjoint(on_rh)
        assert all(before[t].state is TaskState.DISPATCHING for t in on_bridge)

        code, took = await terminate(server, timeout=15.0)
        assert code == 0, (server.log.read_text()[-3000:], code)
        assert took < EXIT_BOUND_S, f"serve took {took:.1f} s to exit"
        await asyncio.wait_for(reader, 5.0)  # the server closed the bridge's connection
        log = server.log.read_text()
        assert "handed back" in log or "back to waiting" in log, log[-3000:]

        after = await tasks(store, ids)
        # Assigned to the bridge, never acknowledged: back at the head, attempt uncharged
        # (the next dispatch is attempt 2 all the same: its own webhook URL).
        for task_id in on_bridge:
            task = after[task_id]
            assert (task.state, task.attempt, task.charged) == (TaskState.PENDING, 1, 0), task
            notes = [e.get("note", "") for e in await store.reads.timeline(task_id)]
            assert "br-graceful" in notes[-1], notes  # why it went back
        # Accepted by RunningHub: left alone, their TASK_END reaches the next server.
        for task_id in on_rh:
            assert after[task_id].state is TaskState.RUNNING, after[task_id]
        # Nothing stranded half-way.
        assert not [t for t in after.values() if t.state is TaskState.DISPATCHING]
        waiting = set(await redis.zrange(store.keys.wait("proj", "comfyui"), 0, -1))
        assert waiting == {t for t, task in after.items() if task.state is TaskState.PENDING}

        with pytest.raises(websockets.ConnectionClosed):
            await client.linger(2.0)  # the server closed the client's socket too
        serve(port)
        again = await Client(port, "biz-graceful").connect()
        for task_id, results in client.results.items():
            again.results.setdefault(task_id, []).extend(results)
        await again.collect(TASKS, timeout=60)
        await again.linger(1.5)
        counts = {task_id: len(r) for task_id, r in again.results.items()}
        assert counts == dict.fromkeys(ids, 1), counts
        assert {r[0]["status"] for r in again.results.values()} == {"success"}
        await again.close()
    finally:
        await redis.aclose()
