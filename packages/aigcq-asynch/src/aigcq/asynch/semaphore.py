"""The per tenant + model concurrency semaphore, with crash-safe leases.

``asynch:sem:{model}:{tenant}`` is a ZSET task_id → lease expiry. Acquiring first drops
expired leases, so a holder that died frees its slot after at most one lease; a live holder
renews its lease while it runs. The limit is the runtime ``max_concurrency`` when set, capped
by the configured one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from redis.commands.core import AsyncScript

from aigcq.asynch.rebuild import RUN_ID_CHECK, RUN_ID_KEY, LeaseScripts, admitting
from aigcq.asynch.runtime import EFFECTIVE_LIMIT, runtime_max_concurrency_key, semaphore_key
from aigcq.observability import metrics

_ACQUIRE = (
    EFFECTIVE_LIMIT
    + RUN_ID_CHECK
    + """
if run_id_missing(KEYS[3]) then return -1 end
local now = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if redis.call('ZCARD', KEYS[1]) >= effective_limit(KEYS[2], tonumber(ARGV[2])) then
    return 0
  end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
return 1
"""
)
# A live holder keeps its lease: one that was lost (Redis lost its data, or a renewal came
# too late) is put back, as the attempt is still running; 0 tells it was missing.
_RENEW = """
local had = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
if had then return 1 end
return 0
"""


@dataclass(eq=False)
class Semaphore(LeaseScripts):
    _acquire: AsyncScript = field(init=False)
    _renew: AsyncScript = field(init=False)

    def __post_init__(self) -> None:
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._renew = self.redis.register_script(_RENEW)

    async def acquire(self, model: str, tenant: str, task_id: str, cap: int) -> bool:
        keys = [semaphore_key(model, tenant), runtime_max_concurrency_key(model), RUN_ID_KEY]
        result = await admitting(
            lambda: self._acquire(keys=keys, args=[task_id, cap, time.time(), self.lease_seconds]),
            self.rebuild,
        )
        return metrics.semaphore_acquired(model, int(result) == 1)

    async def renew(self, model: str, tenant: str, task_id: str) -> bool:
        """Extend the lease; False when it had been lost (it is put back)."""
        args: list[str | float] = [task_id, time.time() + self.lease_seconds]
        return bool(await self._renew(keys=[semaphore_key(model, tenant)], args=args))

    async def release(self, model: str, tenant: str, task_id: str) -> None:
        await self.redis.zrem(semaphore_key(model, tenant), task_id)

    async def holders(self, model: str, tenant: str) -> list[str]:
        """Task ids holding a live lease."""
        members = await self.redis.zrangebyscore(semaphore_key(model, tenant), time.time(), "+inf")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]
