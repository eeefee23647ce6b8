"""A Sentinel-managed Redis fails over under a process's clients: the queue store (its
hot-path connection), the pool and the pub/sub subscription all find the new master with
no restart. Real servers: a master, a replica and three sentinels (tests/fakes/sentinel.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ReadOnlyError, RedisError

from aigcq.config import PlatformConfig, Settings
from aigcq.domain import TaskState
from aigcq.plumbing.events import EventBus
from aigcq.plumbing.redis_client import redis_client
from aigcq.plumbing.redis_mux import RedisMux
from aigcq.queue.store import TaskStore
from aigcq.scheduler.reconcile import CHECK_S, MasterWatch
from aigcq.serve.server import runtime
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
        assert (await store.reads.get("after")) is not None  # the pool's connections moved
        # and the hot path's (not a default host)
        assert (await store.reads.head("later")) is not None
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


async def test_a_master_change_runs_one_reconcile_pass_that_moves_nothing(
    group: SentinelGroup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A paid create recorded as an intent with no answer is named after the promotion and
    left as it was (its webhook or its deadline settle it; it is not sent again)."""
    (tmp_path / "model.json").write_text('{"p": {"comfyui": {"apikey": "k", "concurrency": 1}}}')
    redis = redis_client(group.url)
    settings = Settings(redis_url=group.url, config_dir=tmp_path)
    rt = runtime(settings, PlatformConfig.load(tmp_path), redis)
    heard: list[int] = []

    async def listener() -> None:
        heard.append(1)

    watch = MasterWatch(rt, [listener])
    try:
        store = rt.store
        await store.submit("c1", aigc="p", platform="comfyui", backend_id="c", payload={})
        [claimed] = await store.claim("p", "comfyui", "runninghub", cap=1, n=1, deadline_s=60)
        assert await store.begin_create("c1", claimed.attempt, "create-1", deadline_s=60)
        assert await store.mux.replicas(1, 5000) == 1  # on the replica before the kill
        assert not await watch.check()  # the first master seen: nothing to reconcile
        assert not await watch.check()
        old = group.kill_master()
        await asyncio.to_thread(group.wait_promoted, old)
        with caplog.at_level(logging.WARNING, logger="aigcq.scheduler.reconcile"):
            assert await wait_until(watch.check, 30, 0.2, ignore=(RedisError,))
        assert watch.changes == 1 and heard == [1]
        assert "task c1: create create-1 of attempt 1" in caplog.text
        task = await store.reads.get("c1")
        assert task is not None and task.state is TaskState.DISPATCHING
        assert task.create_id == "create-1"  # moved by nothing
        assert not await watch.check()  # one pass per change
    finally:
        await rt.store.aclose()
        await redis.aclose()


async def test_the_watch_reads_the_masters_identity_as_it_starts(
    tmp_path: Path, redis_url: str
) -> None:
    """A failover in a serve's first second is a change too: the watch knows the master it
    started on at once, not a check interval later (the failover bench's smoke run killed
    the master before a serve's first check, and that serve never reconciled)."""
    (tmp_path / "model.json").write_text("{}")
    redis = redis_client(redis_url)
    rt = runtime(
        Settings(redis_url=redis_url, config_dir=tmp_path), PlatformConfig.load(tmp_path), redis
    )
    watch = MasterWatch(rt)
    running = asyncio.create_task(watch.run())
    try:
        assert await wait_until(lambda: watch.seen, CHECK_S / 2, 0.01)
    finally:
        running.cancel()
        await redis.aclose()
