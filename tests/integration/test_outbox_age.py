"""A message past the outbox retention is not delivered, even to a client that returns
before the retention sweep has dropped it (issue 30 item 6)."""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

from aigcq.delivery.outbox import DrainCursor, Outbox
from aigcq.queue.store import TaskStore

RETENTION_S = 3600


async def test_a_message_past_the_retention_is_left_for_the_sweep(redis: aioredis.Redis) -> None:
    store = TaskStore(redis, "age", retention_s=60, outbox_retention_s=RETENTION_S)
    key = store.keys.outbox("back")
    old_ms = int((time.time() - RETENTION_S - 60) * 1000)
    await redis.xadd(key, {"taskId": "old", "status": "success", "body": "{}"}, id=f"{old_ms}-0")
    await redis.xadd(key, {"taskId": "new", "status": "success", "body": "{}"})
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    outbox = Outbox(store.mux, store.keys, retention_s=RETENTION_S)
    cursor = DrainCursor()
    await outbox.drain("back", send, cursor, auto_ack=False)
    assert [m["taskId"] for m in sent] == ["new"]
    await outbox.drain("back", send, cursor, auto_ack=False)  # the cursor moved on: nothing
    assert [m["taskId"] for m in sent] == ["new"]
    await Outbox(store.mux, store.keys).drain("back", send, DrainCursor(), auto_ack=False)
    assert [m["taskId"] for m in sent] == ["new", "old", "new"]  # no retention: any age
    await store.aclose()
