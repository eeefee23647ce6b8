"""``config/messageDispatcher.json`` options on ``aigcq serve`` (seed 000 §3.7): ``priority``,
``healthCheck.timeout``, ``healthCheck.failureThreshold`` and ``task.retryCount``, against
a real dispatcher, RunningHub emulator, Redis — or a port where nothing answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

import tests.fakes.message_dispatcher as mds
from aigcq.config import PlatformConfig, Settings
from aigcq.dispatcher.process import MessageDispatcher, core_settings
from aigcq.dispatcher.settings import DispatcherSettings
from aigcq.domain import TaskState
from aigcq.health import HealthState
from aigcq.mdclient.target import MessageDispatcherTarget, internal_target
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge
from tests.fakes.client import generate
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until, wait_until

md = mds.md
fast_checks = mds.fast_checks
CLOSED = "http://127.0.0.1:9"  # nothing listens: connection refused


def _md_file(tmp_path: Path, content: dict[str, object]) -> None:
    (tmp_path / "messageDispatcher.json").write_text(orjson.dumps(content).decode())


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def target_for(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, md_url: str
) -> AsyncIterator[tuple[ServeProcess, MessageDispatcherTarget]]:
    """``aigcq serve``'s message-dispatcher target, not started: the test drives it."""
    model = {"proj": {"comfyui": {"apikey": "rh-key", "concurrency": 1}}}
    (tmp_path / "model.json").write_text(orjson.dumps(model).decode())
    settings = Settings(
        redis_url=redis_url,
        token_secret=mds.CLIENT_SECRET,
        config_dir=tmp_path,
        data_dir=tmp_path / "serve",
        message_dispatcher_url=md_url,
    )
    build = internal_target(settings)
    assert build is not None
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis, internal=build)
    target = service.internal
    assert isinstance(target, MessageDispatcherTarget)
    try:
        yield service, target
    finally:
        await target.http.aclose()


@pytest.mark.usefixtures("fast_checks")
async def test_priority_false_puts_runninghub_first(
    md: mds.Md, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """RunningHub (concurrency 1) takes the first task although the dispatcher has room;
    the dispatcher takes the one RunningHub has no room for."""
    _md_file(tmp_path, {"priority": False})
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=2)
    async with mds.serve_split_with_runninghub(
        tmp_path, redis, redis_url, md.base, duration_s=5.0
    ) as (service, client):
        target = service.internal
        assert isinstance(target, MessageDispatcherTarget) and target.preferred is False
        await wait_until(lambda: target.free_slots() == 2)
        await client.request(generate("p-1"))
        first = await until(lambda: service.rt.store.reads.get("p-1"), _running)
        assert first is not None and first.target == "runninghub"
        await client.request(generate("p-2"))
        assign = await bridge.next(timeout=10)
        second = await until(lambda: service.rt.store.reads.get("p-2"), _running)
        assert second is not None and second.target == "message_dispatcher"
        assert assign["data"]["taskId"] == second.remote_id
    await bridge.ws.close()


async def test_health_check_timeout_bounds_each_probe(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """``healthCheck.timeout`` 200 ms: a dispatcher that never answers fails the check in
    about that time (the default would wait 5 s)."""
    _md_file(tmp_path, {"healthCheck": {"timeout": 200}})
    with black_hole() as url:
        async with target_for(tmp_path, redis, redis_url, url) as (_, target):
            assert target.md.health_check_timeout_ms == 200
            watch = asyncio.create_task(target._watch())
            started = time.monotonic()
            try:
                await until(lambda: _state(target), lambda s: s is HealthState.DEGRADED, 3.0)
            finally:
                watch.cancel()
            assert time.monotonic() - started < 1.5
            assert "Timeout" in target.health.reason


async def test_failure_threshold_degrades_after_that_many_failed_checks(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    _md_file(tmp_path, {"healthCheck": {"failureThreshold": 3}})
    async with (
        target_for(tmp_path, redis, redis_url, CLOSED) as (_, target),
        httpx.AsyncClient(timeout=1.0) as http,
    ):
        target.jwt.token, target.jwt.expires_at = "jwt", time.time() + 3600
        await target.check(http)
        await target.check(http)
        assert target.healthy and target.health.failures == 2
        await target.check(http)
        assert not target.healthy and target.health.state is HealthState.DEGRADED


@pytest.mark.parametrize("retries", [0, 2])
async def test_retry_count_resends_a_failed_submit_then_degrades_and_requeues(
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    retries: int,
) -> None:
    """A submit the dispatcher refused (here: nothing listens) is sent ``retryCount`` more
    times; then the task is back at the head of its queue (for RunningHub, the target
    having degraded at the first failure, whatever ``failureThreshold`` says)."""
    _md_file(tmp_path, {"task": {"retryCount": retries}, "healthCheck": {"failureThreshold": 5}})
    async with target_for(tmp_path, redis, redis_url, CLOSED) as (service, target):
        target.jwt.token, target.jwt.expires_at = "jwt", time.time() + 3600
        store = service.rt.store
        await store.submit("r-1", aigc="proj", platform="comfyui", backend_id="b1", payload={})
        claimed = await store.claim("proj", "comfyui", target.name, cap=-1, n=1, deadline_s=30.0)
        assert [c.task_id for c in claimed] == ["r-1"]
        with caplog.at_level(logging.INFO, logger="aigcq.mdclient.target"):
            await target.hand_over("proj", "comfyui", claimed)
        resends = [r for r in caplog.records if "), retry " in r.getMessage()]
        assert len(resends) == retries
        assert target.health.state is HealthState.DEGRADED and target.free_slots() == 0
        task = await store.reads.get("r-1")
        assert task is not None and task.state is TaskState.PENDING
        assert (task.attempt, task.charged) == (1, 0)  # a new attempt next, not charged
        assert await redis.zrange(store.keys.wait("proj", "comfyui"), 0, 0) == ["r-1"]


async def test_feed_lost_checks_at_once_and_a_gone_dispatcher_degrades(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed §8.3.1 (connection lost): with a 100 s health interval, the dispatcher going
    away is noticed within a second: the feed drops, the check runs at once and fails."""
    monkeypatch.setenv("MESSAGE_DISPATCHER_HEALTH_CHECK_INTERVAL", "100000")
    monkeypatch.setenv("MD_PASSWORD", mds.PASSWORD)
    settings = DispatcherSettings(password=mds.PASSWORD, jwt_secret=mds.JWT_SECRET)
    base = Settings(
        redis_url=redis_url,
        token_secret="t" * 40,
        bridge_token=BRIDGE_TOKEN,
        data_dir=tmp_path / "md",
        config_dir=tmp_path / "md",
    )
    dispatcher = MessageDispatcher(settings, core_settings(settings, base), redis)
    async with contextlib.AsyncExitStack() as md_up:
        md_url = await md_up.enter_async_context(serve_app(dispatcher.app))
        bridge = await Bridge.connect(int(md_url.rsplit(":", 1)[1]))
        await bridge.register(count=1)
        async with mds.serve_split(tmp_path, redis, redis_url, md_url) as (service, _):
            target = service.internal
            assert isinstance(target, MessageDispatcherTarget)
            await wait_until(lambda: target.free_slots() == 1)
            await wait_until(lambda: target.feed.connected)
            assert target.healthy
            await bridge.ws.close()
            await md_up.aclose()  # the dispatcher stops
            stopped = time.monotonic()
            await until(lambda: _state(target), lambda s: s is HealthState.DEGRADED, 2.0)
            assert time.monotonic() - stopped < 1.0 and target.free_slots() == 0


async def _state(target: MessageDispatcherTarget) -> HealthState:
    return target.health.state


def _running(task: object) -> bool:
    return getattr(task, "state", None) is TaskState.RUNNING
