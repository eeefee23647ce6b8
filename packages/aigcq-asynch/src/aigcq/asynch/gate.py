"""The queue-limit gate: at most ``queue_limit`` live (state 0/1) tasks per model.

Each live task holds one member of ``asynch:gate:{model}`` (score: when it was taken). Taking
is one Lua script (idempotent per task), so concurrent createTask calls on any number of
processes never exceed the limit. Slots are released when a task reaches state 2 or 3 and
taken again when a failed task is requeued. :meth:`QueueGate.reconcile` repairs what a crash
left behind by comparing the members with the rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis.asyncio as aioredis

from aigcq.asynch.rebuild import RUN_ID_CHECK, RUN_ID_KEY, Rebuild, admitting
from aigcq.asynch.runtime import EFFECTIVE_LIMIT, gate_key, runtime_queue_limit_key
from aigcq.observability import metrics

_TAKE = (
    EFFECTIVE_LIMIT
    + RUN_ID_CHECK
    + """
if run_id_missing(KEYS[3]) then return -1 end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= effective_limit(KEYS[2], tonumber(ARGV[2])) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""
)


class QueueGate:
    def __init__(self, redis: aioredis.Redis, rebuild: Rebuild | None = None) -> None:
        self.redis = redis
        self.rebuild = rebuild
        self._take = redis.register_script(_TAKE)

    async def take(self, model: str, task_id: str, cap: int) -> bool:
        """Take a slot for ``task_id``; False when the model's queue is full."""
        keys = [gate_key(model), runtime_queue_limit_key(model), RUN_ID_KEY]
        result = await admitting(
            lambda: self._take(keys=keys, args=[task_id, cap, time.time()]), self.rebuild
        )
        return metrics.gate_taken(model, int(result) == 1)

    async def release(self, model: str, *task_ids: str) -> None:
        if task_ids:
            await self.redis.zrem(gate_key(model), *task_ids)

    async def holders(self, model: str, older_than: float) -> list[str]:
        """Members taken before ``older_than`` (a Unix time)."""
        members = await self.redis.zrangebyscore(gate_key(model), "-inf", older_than)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    async def models(self) -> list[str]:
        """Models that have a gate key."""
        prefix = gate_key("")
        names = [k async for k in self.redis.scan_iter(match=f"{prefix}*", count=500)]
        return [(k.decode() if isinstance(k, bytes) else str(k))[len(prefix) :] for k in names]

    async def restore(self, model: str, task_ids: Iterable[str]) -> int:
        """Add members for live tasks the gate lost (e.g. Redis restarted without data)."""
        mapping = {t: time.time() for t in task_ids}
        if not mapping:
            return 0
        return int(await self.redis.zadd(gate_key(model), mapping, nx=True) or 0)
