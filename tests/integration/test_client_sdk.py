"""The client SDK against an in-process aigcq and RunningHub emulator: results exactly once."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.client import AsyncClient, Client, Event, Progress, Result, SubmitError
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.service import service_with_runninghub
from tests.fakes.waiting import until, wait_until

TOKEN = "sdk-client-token"
PAYLOAD = {"workflowId": "1904136902449209346", "nodeInfoList": []}
MODELS = (
    '{"proj": {"comfyui": {"apikey": "k", "concurrency": 5}},'
    ' "idle": {"comfyui": {"apikey": "k", "concurrency": 0}}}'  # its tasks never start
)


@dataclass
class Stack:
    url: str
    redis: aioredis.Redis

    def client(self, backend_id: str = "b1") -> AsyncClient:
        return AsyncClient(self.url, TOKEN, backend_id, backoff=(0.05, 0.2))

    async def outbox(self, backend_id: str = "b1") -> int:
        """Results the server still holds for ``backend_id`` (not yet acknowledged)."""
        return int(await self.redis.xlen(f"aigcq:outbox:{backend_id}"))


@pytest.fixture
async def stack(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Stack]:
    emulator = RunningHubEmulatorConfig(duration_s=0.2, max_concurrent=10)
    async with service_with_runninghub(
        tmp_path, redis, redis_url, models=MODELS, emulator=emulator, token=TOKEN
    ) as env:
        yield Stack(env.ws_url, redis)


async def submit_all(client: AsyncClient, n: int, prefix: str) -> list[str]:
    return [
        await client.submit("comfyui", PAYLOAD, task_id=f"{prefix}{i}", aigc="proj")
        for i in range(n)
    ]


async def test_submit_and_await_results_with_progress(stack: Stack) -> None:
    async with stack.client() as client:
        seen: list[Event] = []

        async def follow() -> None:
            async for event in client.events():
                seen.append(event)
                if sum(isinstance(e, Result) for e in seen) == 3:
                    return

        follower = asyncio.create_task(follow())
        await wait_until(lambda: client._subscribers)  # subscribed before anything is submitted
        ids = await submit_all(client, 3, "ok")
        results = [await client.result(task_id, timeout=10) for task_id in ids]
        assert all(r.ok and r.data for r in results), results
        await asyncio.wait_for(follower, 5)
        running = [e for e in seen if isinstance(e, Progress)]
        assert {(p.task_id, p.state, p.target) for p in running} == {
            (t, "running", "runninghub") for t in ids
        }
        with pytest.raises(SubmitError) as refused:
            await client.submit("jimuai", PAYLOAD, aigc="proj")
        assert refused.value.code == "PlatformError"
    await until(stack.outbox, lambda n: n == 0)  # every result acknowledged


async def test_a_dropped_socket_reconnects_and_loses_or_repeats_nothing(stack: Stack) -> None:
    async with stack.client() as client:
        ids = await submit_all(client, 10, "drop")
        counts: collections.Counter[str] = collections.Counter()
        async for event in client.events():
            if isinstance(event, Result):
                counts[event.task_id] += 1
                if len(counts) == 3:  # its ack is lost with the socket: it will come again
                    client._ws.transport.abort()
                if len(counts) == len(ids):
                    break
        assert counts == dict.fromkeys(ids, 1)
        await asyncio.sleep(0.3)  # time: a late copy would come now
        assert not client._fresh  # late copies were dropped, not held for hand-over
        await until(stack.outbox, lambda n: n == 0)


async def test_a_killed_client_leaves_the_rest_for_the_next_one(stack: Stack) -> None:
    first = stack.client()
    await first.connect()
    ids = await submit_all(first, 8, "kill")
    handed = [await first.result(task_id, timeout=10) for task_id in ids[:3]]
    # The rest arrive too, but the first client never hands them over (nor acknowledges).
    await until(stack.outbox, lambda n: n == len(ids) - len(handed), within=10)
    first._ws.transport.abort()
    await first.close()

    async with stack.client() as second:
        rest = [await second.result(task_id, timeout=10) for task_id in ids[3:]]
        await asyncio.sleep(0.3)  # time: anything else would come now
        assert not second._fresh  # nothing else came: the handed ones are gone for good
    assert all(r.ok for r in handed + rest)
    await until(stack.outbox, lambda n: n == 0)


def sync_roundtrip(url: str) -> tuple[Result, str, Result]:
    with Client(url, TOKEN, "sync") as client:
        done = client.result(client.submit("comfyui", PAYLOAD, aigc="proj"), timeout=10)
        waiting = client.submit("comfyui", PAYLOAD, aigc="idle")
        return done, client.cancel(waiting), client.result(waiting, timeout=10)


async def test_sync_client_submits_awaits_and_cancels(stack: Stack) -> None:
    done, state, cancelled = await asyncio.to_thread(sync_roundtrip, stack.url)
    assert done.ok
    assert state == "cancelled" and cancelled.status == "cancelled"


async def test_cli_submit_prints_the_result(stack: Stack) -> None:
    args = ["submit", "comfyui", json.dumps(PAYLOAD), "--server", stack.url, "--aigc", "proj"]
    run = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--token", TOKEN])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout[run.stdout.index("{") :])["status"] == "success"
