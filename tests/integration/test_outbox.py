"""The per-client outbox: retention by time (issue 15 item 9) and drains that fail
half-way (item 10), against a real Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.delivery.outbox import DrainCursor, Outbox
from aigcq.delivery.retention import EMPTY_GRACE_S, OutboxRetention
from aigcq.domain import TaskState
from aigcq.queue.store import TaskStore

DAY = 86400.0
RETENTION = 2 * DAY  # seed 001: offline messages are kept 2 days


@pytest.fixture
async def store(redis: aioredis.Redis) -> AsyncIterator[TaskStore]:
    store = TaskStore(redis, "ob", retention_s=3600, outbox_retention_s=int(RETENTION))
    yield store
    await store.aclose()


async def _results(store: TaskStore, backend_id: str, count: int) -> None:
    for i in range(count):
        task_id = f"{backend_id}-{i}"
        payload: dict[str, Any] = {}
        await store.submit(task_id, aigc="p", platform="x", backend_id=backend_id, payload=payload)
        await store.finish(task_id, TaskState.SUCCESS, result={"n": i}, message={"n": i})


async def test_a_client_that_never_returns_has_its_results_dropped_after_retention(
    store: TaskStore, redis: aioredis.Redis
) -> None:
    await _results(store, "gone", 3)
    retention = OutboxRetention(redis, store.keys, RETENTION)
    now = time.time()
    assert await retention.sweep(now + DAY) == 0  # within the retention: all kept
    assert await redis.xlen("ob:outbox:gone") == 3
    assert await retention.sweep(now + RETENTION + 60) == 1
    assert not await redis.exists("ob:outbox:gone")
    assert await redis.zscore("ob:outboxes", "gone") is None


async def test_old_messages_of_a_client_with_new_ones_are_trimmed_by_time(
    store: TaskStore, redis: aioredis.Redis
) -> None:
    old_ms = int((time.time() - RETENTION - DAY) * 1000)
    await redis.xadd("ob:outbox:busy", {"taskId": "old", "status": "success"}, id=f"{old_ms}-0")
    await _results(store, "busy", 1)  # a recent one (XADD MINID ~ trims whole nodes only)
    await OutboxRetention(redis, store.keys, RETENTION).sweep(time.time())
    entries = await redis.xrange("ob:outbox:busy")
    assert [fields["taskId"] for _, fields in entries] == ["busy-0"]


async def test_a_drained_stream_does_not_linger_as_an_empty_key(
    store: TaskStore, redis: aioredis.Redis
) -> None:
    await _results(store, "reader", 2)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await Outbox(store.mux, store.keys).drain("reader", send, DrainCursor(), auto_ack=True)
    assert [m["taskId"] for m in sent] == ["reader-0", "reader-1"]
    retention = OutboxRetention(redis, store.keys, RETENTION)
    now = time.time()
    assert await retention.sweep(now) == 0  # just drained: a new message may follow
    assert await redis.exists("ob:outbox:reader")
    assert await retention.sweep(now + EMPTY_GRACE_S + 1) == 1
    assert not await redis.exists("ob:outbox:reader")
    assert await redis.zscore("ob:outboxes", "reader") is None


async def test_streams_written_before_the_index_are_swept_too(
    store: TaskStore, redis: aioredis.Redis
) -> None:
    await _results(store, "legacy", 1)
    await redis.delete("ob:outboxes")  # as written by a version without the index
    retention = OutboxRetention(redis, store.keys, RETENTION)
    now = time.time()
    await retention.sweep(now)
    assert await redis.zscore("ob:outboxes", "legacy") is not None
    assert await retention.sweep(now + RETENTION + 60) == 1
    assert not await redis.exists("ob:outbox:legacy")


async def test_a_drain_that_fails_half_way_does_not_resend_what_it_sent(
    store: TaskStore, redis: aioredis.Redis
) -> None:
    await _results(store, "flaky", 5)
    outbox = Outbox(store.mux, store.keys)
    cursor = DrainCursor()
    sent: list[str] = []

    async def breaks_on_the_third(message: dict[str, Any]) -> None:
        if len(sent) == 2:
            raise ConnectionError("socket gone mid-page")
        sent.append(message["taskId"])

    with pytest.raises(ConnectionError):
        await outbox.drain("flaky", breaks_on_the_third, cursor, auto_ack=True)
    assert sent == ["flaky-0", "flaky-1"]
    assert await redis.xlen("ob:outbox:flaky") == 3  # what was sent is deleted
    more: list[str] = []

    async def works(message: dict[str, Any]) -> None:
        more.append(message["taskId"])

    await outbox.drain("flaky", works, cursor, auto_ack=True)
    assert more == ["flaky-2", "flaky-3", "flaky-4"]  # nothing sent twice
    assert await redis.xlen("ob:outbox:flaky") == 0


async def test_indexing_streams_written_before_the_index_is_one_write_per_scan_page(
    store: TaskStore, redis: aioredis.Redis
) -> None:
    for i in range(40):  # streams of a version without the index
        await redis.xadd(f"ob:outbox:legacy-{i}", {"taskId": f"t{i}", "status": "success"})
    await redis.config_resetstat()
    await OutboxRetention(redis, store.keys, RETENTION).index_existing(time.time())
    assert await redis.zcard("ob:outboxes") == 40
    stats = await redis.info("commandstats")
    assert stats["cmdstat_zadd"]["calls"] <= stats["cmdstat_scan"]["calls"]
