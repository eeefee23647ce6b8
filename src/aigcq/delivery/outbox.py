"""The durable per-client outbox (seed 001 §9): a Redis Stream per backendId.

``finish.lua`` appends a task's final message to its client's stream in the same atomic
step that ends the task, so a result can never be lost between "done" and "queued for
delivery". Messages are sent in order; without client acks they are deleted once
written to the socket, with acks (``{"type":"ack","id":...}``) only when acknowledged.
Entries older than the retention are trimmed by ``XADD MINID``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from redis.asyncio import Redis

from aigcq.queue.keys import Keys

Send = Callable[[dict[str, Any]], Awaitable[None]]

PAGE = 200


def compose(entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    body = orjson.loads(fields.get("body") or "{}")
    return {
        "type": "result",
        "id": entry_id,
        "taskId": fields.get("taskId", ""),
        "status": fields.get("status", ""),
        **body,
    }


class Outbox:
    def __init__(self, redis: Redis, keys: Keys, command: Callable[..., Awaitable[Any]]) -> None:
        """``command(*args)`` runs a Redis command and returns its raw RESP2 reply
        (:meth:`TaskStore.command`, which pipelines concurrent drains together)."""
        self.redis = redis
        self.keys = keys
        self.command = command

    async def drain(self, backend_id: str, send: Send, *, after: str, auto_ack: bool) -> str:
        """Send every message after stream id ``after``; returns the last id sent."""
        key = self.keys.outbox(backend_id)
        while True:
            start = f"({after}" if after != "-" else "-"
            entries = await self.command("XRANGE", key, start, "+", "COUNT", PAGE)
            if not entries:
                return after
            sent: list[str] = []
            for raw_id, raw_fields in entries:  # [id, [field, value, ...]]
                entry_id = _s(raw_id)
                flat = [_s(x) for x in raw_fields or []]
                await send(compose(entry_id, dict(zip(flat[0::2], flat[1::2], strict=True))))
                sent.append(entry_id)
                after = entry_id
            if auto_ack:
                await self.command("XDEL", key, *sent)
            if len(entries) < PAGE:
                return after

    async def ack(self, backend_id: str, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        return int(await self.redis.xdel(self.keys.outbox(backend_id), *entry_ids))

    async def pending(self, backend_id: str) -> int:
        return int(await self.redis.xlen(self.keys.outbox(backend_id)))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
