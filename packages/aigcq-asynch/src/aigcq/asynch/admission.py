"""createTask's gate + semaphore in one Redis call, and the finish's release in one.

:meth:`Admission.take` runs the gate's take and then, only when the gate let the task in,
the semaphore's acquire: the same steps as the scripts of :mod:`aigcq.asynch.gate` and
:mod:`aigcq.asynch.semaphore`, in one atomic Lua call, so every guarantee of those two holds.
:meth:`Admission.release` frees a finished attempt's semaphore lease and, when the attempt
was recorded, its gate slot.

Concurrent calls are coalesced (:mod:`aigcq.asynch.coalesce`): one atomic script call
handles a batch, its releases first, then its takes one by one in arrival order, each
exactly as if it ran alone.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from redis.commands.core import AsyncScript

from aigcq.asynch.coalesce import Coalescer
from aigcq.asynch.rebuild import REBUILD_NEEDED, RUN_ID_CHECK, RUN_ID_KEY, LeaseScripts, admitting
from aigcq.asynch.runtime import (
    EFFECTIVE_LIMIT,
    gate_key,
    runtime_max_concurrency_key,
    runtime_queue_limit_key,
    semaphore_key,
)
from aigcq.observability import metrics
from aigcq.plumbing.redis_mux import RedisMux

# Releases then takes, in one call. ARGV[1]: now, ARGV[2]: lease seconds, ARGV[3]: number
# of releases r. Release j: KEYS[2j-1] semaphore, KEYS[2j] gate; ARGV[3j+1] lease ('' for
# none), ARGV[3j+2] task_id, ARGV[3j+3] '1' to release the gate slot. Take i (k = 2r + 4(i-1),
# a = 3 + 3r + 4(i-1)): KEYS[k+1..k+4] gate, runtime queue limit, semaphore, runtime max
# concurrency; ARGV[a+1..a+4] task_id, queue cap, lease, semaphore cap. Returns one result
# per take: 0 queue full, 1 queued (gate slot only), 2 running (gate slot and lease), or -1
# for every take when the last key, the run id, is missing (Redis lost its data: rebuild).
_OPS = (
    EFFECTIVE_LIMIT
    + RUN_ID_CHECK
    + """
local now = tonumber(ARGV[1])
local expiry = now + tonumber(ARGV[2])
local releases = tonumber(ARGV[3])
for j = 1, releases do
  local a = 3 * j
  if ARGV[a + 1] ~= '' then redis.call('ZREM', KEYS[2 * j - 1], ARGV[a + 1]) end
  if ARGV[a + 3] == '1' then redis.call('ZREM', KEYS[2 * j], ARGV[a + 2]) end
end
local out = {}
local takes = (#KEYS - 1 - 2 * releases) / 4
if run_id_missing(KEYS[#KEYS]) then
  for i = 1, takes do out[i] = -1 end
  return out
end
for i = 1, takes do
  local k, a = 2 * releases + 4 * (i - 1), 3 + 3 * releases + 4 * (i - 1)
  local gate, sem = KEYS[k + 1], KEYS[k + 3]
  local result = 2
  if not redis.call('ZSCORE', gate, ARGV[a + 1]) then
    if redis.call('ZCARD', gate) >= effective_limit(KEYS[k + 2], tonumber(ARGV[a + 2])) then
      result = 0
    else
      redis.call('ZADD', gate, now, ARGV[a + 1])
    end
  end
  if result == 2 then
    redis.call('ZREMRANGEBYSCORE', sem, '-inf', now)
    if not redis.call('ZSCORE', sem, ARGV[a + 3]) and
        redis.call('ZCARD', sem) >= effective_limit(KEYS[k + 4], tonumber(ARGV[a + 4])) then
      result = 1
    else
      redis.call('ZADD', sem, expiry, ARGV[a + 3])
    end
  end
  out[i] = result
end
return out
"""
)


class Admitted(enum.IntEnum):
    REBUILD_NEEDED = REBUILD_NEEDED  # internal: Redis lost its data, nothing taken
    QUEUE_FULL = 0  # refused by the gate: nothing taken
    QUEUED = 1  # gate slot taken, no semaphore lease: the task waits in state 0
    RUNNING = 2  # gate slot and semaphore lease taken: the task may start now


class _Take(NamedTuple):
    model: str
    tenant: str
    task_id: str
    lease: str
    queue_cap: int
    sem_cap: int


class _Release(NamedTuple):
    model: str
    tenant: str
    task_id: str
    lease: str | None
    gate: bool


@dataclass(eq=False)
class Admission(LeaseScripts):
    _script: AsyncScript = field(init=False)
    _mux: RedisMux = field(init=False)  # a call per createTask and per finished attempt
    _ops: Coalescer[_Take | _Release, Admitted | None] = field(init=False)

    def __post_init__(self) -> None:
        self._script = self.redis.register_script(_OPS)
        self._mux = RedisMux(self.redis)
        self._ops = Coalescer(self._run)

    async def aclose(self) -> None:
        await self._mux.aclose()

    async def take(
        self, model: str, tenant: str, task_id: str, lease: str, queue_cap: int, sem_cap: int
    ) -> Admitted:
        """Take a gate slot for ``task_id`` and, if that worked, try the lease ``lease``."""
        take = _Take(model, tenant, task_id, lease, queue_cap, sem_cap)
        admitted = await admitting(lambda: self._ops.submit(take), self.rebuild)
        assert admitted is not None
        if metrics.gate_taken(model, admitted is not Admitted.QUEUE_FULL):
            metrics.semaphore_acquired(model, admitted is Admitted.RUNNING)
        return admitted

    async def release(
        self, model: str, tenant: str, task_id: str, lease: str | None, *, gate: bool
    ) -> None:
        """Drop the semaphore ``lease`` (if any) and, when ``gate``, the task's gate slot."""
        if lease is not None or gate:
            await self._ops.submit(_Release(model, tenant, task_id, lease, gate))

    async def _run(self, items: Sequence[_Take | _Release]) -> list[Admitted | None]:
        releases = [i for i in items if isinstance(i, _Release)]
        takes = [i for i in items if isinstance(i, _Take)]
        keys: list[str] = []
        args: list[str | float] = [time.time(), self.lease_seconds, len(releases)]
        for r in releases:
            keys += [semaphore_key(r.model, r.tenant), gate_key(r.model)]
            args += [r.lease or "", r.task_id, "1" if r.gate else "0"]
        for t in takes:
            keys += [
                gate_key(t.model),
                runtime_queue_limit_key(t.model),
                semaphore_key(t.model, t.tenant),
                runtime_max_concurrency_key(t.model),
            ]
            args += [t.task_id, t.queue_cap, t.lease, t.sem_cap]
        keys.append(RUN_ID_KEY)
        taken = iter(await self._mux.script(self._script, keys, args))
        return [Admitted(int(next(taken))) if isinstance(i, _Take) else None for i in items]
