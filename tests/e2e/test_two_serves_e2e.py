"""Two ``aigcq serve`` processes on one Redis, RunningHub configured (issue 24 items 6, 7).

Each process is real (the servers, the RunningHub emulator, Redis); the bridges are the
test's own WebSockets (tests/fakes/bridge.py), so the test decides which process each
connects to and which process each TASK_END reaches, as a load balancer would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from tests.fakes.bridge import INSTANCE_LOST, Bridge, post_task_end
from tests.fakes.client import Client, generate
from tests.fakes.processes import BRIDGE_TOKEN, Cluster
from tests.fakes.waiting import until

pytestmark = pytest.mark.e2e


@dataclass
class TwoServes:
    cluster: Cluster
    rh: str
    ports: tuple[int, int]
    redis: redis.Redis

    def base(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    async def bridge(self, i: int, bridge_id: str, **register: Any) -> Bridge:
        """A one-instance bridge, new, registered with serve ``i`` (its record says so),
        its free slot published for the other serve (``internal:free``); ``register``:
        more REGISTER fields."""
        bridge = await Bridge.connect(self.ports[i], BRIDGE_TOKEN)
        await bridge.register(bridge_id, count=1, **register)
        key = f"aigcq:bridge:{bridge_id}"
        await self.until_redis("1", "HGET", key, "online")
        process = self.redis.hget(key, "process") or ""

        def published() -> bool:
            entry = self.redis.hget("aigcq:internal:free", process) or "0"
            return int(entry.split()[0]) >= 1

        await until(lambda: asyncio.to_thread(published), bool, 10)
        return bridge

    async def until_redis(self, expected: Any, *command: str) -> None:
        """Until Redis answers ``command`` with ``expected``."""

        def reply() -> Any:
            return self.redis.execute_command(*command)

        await until(lambda: asyncio.to_thread(reply), lambda got: got == expected, 10)

    def paid_creates(self) -> int:
        return int(httpx.get(f"{self.rh}/_emulator/stats").json()["created"])


@pytest.fixture
def two(cluster: Cluster) -> Iterator[TwoServes]:
    with serves(cluster) as t:
        yield t


@contextlib.contextmanager
def serves(cluster: Cluster, concurrency: int = 5, **env: str) -> Iterator[TwoServes]:
    """Two serves on ``cluster``'s Redis, RunningHub at ``concurrency`` (its runs last
    60 s: a paid task stays counted)."""
    rh = cluster.emulator("runninghub", "--max-concurrent", "5", "--duration", "60")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": concurrency}}})
    _, a = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, **env)
    _, b = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, **env)
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    yield TwoServes(cluster, rh, (a, b), client)
    client.close()


async def assigned(bridge: Bridge, task_id: str) -> dict[str, Any]:
    """The next frame is ``task_id``'s TASK_ASSIGN: acknowledged; its data."""
    msg = await bridge.next(timeout=10)
    assert (msg["type"], msg["data"]["taskId"]) == ("TASK_ASSIGN", task_id), msg
    await bridge.ack(task_id)
    data: dict[str, Any] = msg["data"]
    return data


async def result(client: Client, task_id: str) -> dict[str, Any]:
    while True:
        msg = await client.next(timeout=15)
        if msg.get("type") == "result" and msg.get("taskId") == task_id:
            return msg


async def running(two: TwoServes, task_id: str, attempt: int) -> None:
    key = f"aigcq:task:{task_id}"
    await two.until_redis(["running", str(attempt)], "HMGET", key, "status", "attempt")


async def test_a_bridge_with_a_new_id_gets_work_at_once(two: TwoServes) -> None:
    """A seed bridge that restarts with a new uuid, three times, on serve 0; the tasks are
    submitted to serve 1. Each replacement's first task runs on it: nothing is paid."""
    client = await Client(two.ports[1], "biz-new").connect()
    for i in range(3):
        bridge = await two.bridge(0, f"uuid-{i}")
        await client.request(generate(f"new-{i}"))
        hook = (await assigned(bridge, f"new-{i}"))["webhookUrl"]
        await running(two, f"new-{i}", 1)
        assert await post_task_end(two.base(0), hook) == 200
        assert (await result(client, f"new-{i}"))["status"] == "success"
        await bridge.ws.close()
    assert two.paid_creates() == 0
    await client.close()


async def test_a_machine_failure_reported_to_the_other_serve_is_retried_on_its_bridge(
    two: TwoServes,
) -> None:
    """The bridge is connected to serve 1, its TASK_ENDs reach serve 0: the retry of an
    instance lost runs on the bridge once serve 1 freed its slot (was: paid 9 of 10)."""
    bridge = await two.bridge(1, "on-serve-1")
    client = await Client(two.ports[0], "biz-lost").connect()
    for i in range(10):
        task_id = f"lost-{i}"
        await client.request(generate(task_id))
        hook = (await assigned(bridge, task_id))["webhookUrl"]
        await running(two, task_id, 1)
        assert await post_task_end(two.base(0), hook, code=1, failure=INSTANCE_LOST) == 200
        retry = await assigned(bridge, task_id)
        assert retry["attempt"] == 2
        await running(two, task_id, 2)
        assert await post_task_end(two.base(0), retry["webhookUrl"]) == 200
        assert (await result(client, task_id))["status"] == "success"
    assert two.paid_creates() == 0
    await client.close()


async def test_a_timed_out_attempt_on_the_other_serve_is_cancelled_there(
    cluster: Cluster,
) -> None:
    """Attempt 1 runs on serve 1's bridge past its 2 s deadline: whichever serve's sweep
    sees it, serve 1 sends its bridge TASK_CANCEL for attempt 1 (issue 42 item 10), and the
    bridge's slot stays taken until it reports it free (it sends CAPACITY); attempt 2 runs
    on serve 0's bridge and ends there."""
    with serves(cluster, concurrency=0, AIGCQ_TASK_DEADLINE_S="2") as two:
        first = await two.bridge(1, "first", capacityReports=True)
        client = await Client(two.ports[0], "biz-sup").connect()
        await client.request(generate("sup"))
        await assigned(first, "sup")
        stop = await first.next(timeout=10)
        assert stop == {"type": "TASK_CANCEL", "data": {"taskId": "sup", "attempt": 1}}
        second = await two.bridge(0, "second")
        new = await assigned(second, "sup")  # after the deadline: another attempt
        assert new["attempt"] == 2
        await running(two, "sup", 2)
        assert await post_task_end(two.base(0), new["webhookUrl"]) == 200
        assert (await result(client, "sup"))["status"] == "success"
        await client.close()
