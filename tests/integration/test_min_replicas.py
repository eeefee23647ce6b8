"""AIGCQ_REDIS_MIN_REPLICAS: what a failover could lose is never acknowledged. With one
replica required and that replica frozen (SIGSTOP: it stops acknowledging), a submit is
refused, a paid create is not sent, a TASK_END gets no 200; once it is back, each goes
through, once. Real servers: a master and a replica (tests/fakes/sentinel.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest

from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.plumbing.redis_client import redis_client
from tests.fakes.client import generate
from tests.fakes.paid import Paid, created, paid_stack
from tests.fakes.sentinel import SentinelGroup
from tests.fakes.waiting import until, wait_until

SUCCESS = {"code": 0, "data": [{"fileUrl": "https://rh.example/out.png", "fileType": "png"}]}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[SentinelGroup]:
    with SentinelGroup(tmp_path / "redis", sentinel_count=0) as group:
        yield group


@asynccontextmanager
async def durable_stack(
    tmp_path: Path, pair: SentinelGroup, **settings: object
) -> AsyncIterator[Paid]:
    redis = redis_client(pair.url)
    try:
        async with paid_stack(
            tmp_path,
            redis,
            pair.url,
            redis_min_replicas=1,
            redis_wait_timeout_ms=200,
            **settings,
        ) as env:
            yield env
    finally:
        await redis.aclose()


async def test_a_submit_is_acknowledged_only_once_a_replica_has_it(
    tmp_path: Path, pair: SentinelGroup
) -> None:
    async with durable_stack(tmp_path, pair) as env:
        with pair.nodes[1].frozen():
            refused = await env.client.request(generate("s1"))
        assert refused["type"] == "error" and refused["code"] == "AssessmentError", refused
        accepted = await env.client.request(generate("s1"))  # the client's retry, same id
        assert accepted["type"] != "error", accepted
        await until(partial(env.task, "s1"), lambda t: t.state is TaskState.SUCCESS, within=15)
        assert await env.double_paid() == {}


async def test_a_paid_create_waits_until_its_intent_is_replicated(
    tmp_path: Path, pair: SentinelGroup
) -> None:
    async with durable_stack(tmp_path, pair) as env:
        store = env.service.rt.store
        replica = pair.nodes[1]
        with replica.frozen():
            # the task is stored as a replicated submit would leave it; the replica stops
            # acknowledging before the dispatch loop records its create intent
            payload = generate("c1")["payload"]
            await store.submit(
                "c1", aigc="proj", platform="comfyui", backend_id="b1", payload=payload
            )
            await wait_until(
                lambda: _noted(env, "c1", "not replicated"), 15, what="a create not sent"
            )
            assert await env.creates("c1") == []  # nothing paid while it is not durable
        await created(env, "c1")
        await until(partial(env.task, "c1"), lambda t: t.state is TaskState.SUCCESS, within=15)
        assert len(await env.creates("c1")) == 1


async def _noted(env: Paid, task_id: str, words: str) -> bool:
    timeline = await env.service.rt.store.reads.timeline(task_id)
    return any(words in str(entry) for entry in timeline)


async def test_a_task_end_gets_its_200_only_once_a_replica_has_the_result(
    tmp_path: Path, pair: SentinelGroup
) -> None:
    rh = RunningHubEmulatorConfig(duration_s=600.0)  # its own webhook never comes
    async with durable_stack(tmp_path, pair, rh=rh) as env:
        await env.client.request(generate("w1"))
        task = await until(partial(env.task, "w1"), lambda t: t.state is TaskState.RUNNING)
        with pair.nodes[1].frozen():
            status = await env.post_task_end("w1", task.attempt, SUCCESS, here=True)
        assert status == 503  # RunningHub sends it again
        assert await env.post_task_end("w1", task.attempt, SUCCESS, here=True) == 200
        await until(partial(env.task, "w1"), lambda t: t.state is TaskState.SUCCESS)
        assert len(env.client.results.get("w1", [])) <= 1
