"""A Sentinel-managed Redis fails over under a process's clients: the queue store (its
hot-path connection), the pool and the pub/sub subscription all find the new master with
no restart. Real servers: a master, a replica and three sentinels (tests/fakes/sentinel.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ReadOnlyError, RedisError

from aigcq.plumbing.events import EventBus
from aigcq.plumbing.redis_client import redis_client
from aigcq.plumbing.redis_mux import RedisMux
from aigcq.queue.store import TaskStore
from tests.fakes.sentinel import SentinelGroup
from tests.fakes.waiting import wait_until

PREFIX = "ha"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with SentinelGroup(tmp_path) as g:
        yield g


async def _submit(store: TaskStore, task_id: str) -> bool:
    """Submit (idempotent by id); False while Redis does not answer (the failover)."""
    try:
        await store.submit(task_id, aigc="p", platform="comfyui", backend_id="c", payload={})
    except RedisError:
        return False
    return True


async def test_the_store_pool_and_subscription_follow_a_failover(group: SentinelGroup) -> None:
    redis = redis_client(group.url)
    store = TaskStore(redis, PREFIX, retention_s=60, outbox_retention_s=60)
    wakes: list[int] = []
    bus = EventBus(
        redis,
        store.keys.events,
        on_wake=lambda: wakes.append(1),
        on_outbox=lambda _: None,
        on_client=lambda *_: None,
        on_progress=lambda *_: None,
    )
    listening = asyncio.create_task(bus.run())
    try:
        await wait_until(lambda: wakes, 10, what="subscribed")
        assert await _submit(store, "before")
        old = group.kill_master()
        new = await asyncio.to_thread(group.wait_promoted, old)
        await wait_until(lambda: _submit(store, "after"), 30, 0.1, what="a submit on the new one")
        heard = len(wakes)
        await wait_until(lambda: _submit(store, "later"), 10, what="a second submit")
        # the subscription moved too: the new master's wake events reach this process
        await wait_until(lambda: len(wakes) > heard, 10, what="a wake from the new master")
        assert (await store.get("after")) is not None  # the pool's connections moved
        assert (await store.head("later")) is not None  # and the hot path's (not a default host)
        assert new.client().exists(store.keys.task("after"), store.keys.task("later")) == 2
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
        await store.aclose()
        await redis.aclose()


async def test_a_hot_path_connection_on_a_demoted_server_drops_itself(
    group: SentinelGroup,
) -> None:
    """What a failover DNS name or a proxy still pointing at the old master gives: READONLY.
    The command fails unrun and the connection is dropped, so the next one reconnects."""
    replica = group.nodes[1]
    redis = redis_client(f"redis://127.0.0.1:{replica.port}/0")
    mux = RedisMux(redis)
    try:
        assert await mux.command("PING") == "PONG"
        assert mux.connected
        with pytest.raises(ReadOnlyError):
            await mux.command("SET", "k", "v")
        assert not mux.connected
        assert await mux.command("PING") == "PONG"  # made again on the next command
    finally:
        await mux.aclose()
        await redis.aclose()
