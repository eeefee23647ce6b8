"""Rebuilding the Redis side (gates and semaphores) from PostgreSQL when Redis lost its data.

``asynch:run_id`` is set when the Redis state is known to match the rows. Every script that
admits work (createTask's gate + semaphore, a worker's semaphore lease, a retry's gate slot)
first checks that the key exists and, when it does not (a fresh Redis, or one that came
back empty after a restart or a flush), refuses with :data:`REBUILD_NEEDED` instead of
deciding against empty counters. The caller then runs :meth:`Rebuilder.ensure` and tries
again: under a PostgreSQL advisory lock (one process rebuilds, the others wait for it), every
live task (state 0 or 1) gets its gate slot back, every running attempt its semaphore lease
(with a fresh expiry: a dead holder's lease then runs out, see
:meth:`aigcq.asynch.cleaner.Cleaner.reclaim`), and the run id is set in the same
transaction, so no work is admitted against half-rebuilt counters.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import redis.asyncio as aioredis

from aigcq.asynch.db import Pool
from aigcq.asynch.runtime import PREFIX, gate_key, semaphore_key

log = logging.getLogger(__name__)

RUN_ID_KEY = f"{PREFIX}run_id"
#: What an admitting script answers when ``RUN_ID_KEY`` is missing.
REBUILD_NEEDED = -1
LOCK_ID = 0x617379_6E6369  # next to the migration lock's id
#: Lua prelude of the admitting scripts: ``run_id_missing(key)``.
RUN_ID_CHECK = """
local function run_id_missing(key)
  return redis.call('EXISTS', key) == 0
end
"""


class RedisStateLost(RuntimeError):
    """Admission found no run id even after a rebuild (Redis keeps losing its data)."""


#: What an admitting caller runs when Redis lost its data (:meth:`Rebuilder.ensure`).
Rebuild = Callable[[], Awaitable[None]]
_Answer = TypeVar("_Answer")


async def admitting(script: Callable[[], Awaitable[_Answer]], rebuild: Rebuild | None) -> _Answer:
    """Run an admitting ``script``; while it answers :data:`REBUILD_NEEDED`, ``rebuild`` and
    run it again, three times at most, then :class:`RedisStateLost`."""
    for _ in range(3):
        answer = await script()
        if answer != REBUILD_NEEDED:
            return answer
        if rebuild is None:
            break
        await rebuild()
    raise RedisStateLost("Redis lost the asynch state and it could not be rebuilt")


@dataclass(eq=False)
class LeaseScripts:
    """Base of the Redis scripts that hand out semaphore leases of ``lease_seconds``
    (:class:`~aigcq.asynch.semaphore.Semaphore`, :class:`~aigcq.asynch.admission.Admission`):
    their admitting calls run ``rebuild`` when Redis lost its data (:func:`admitting`)."""

    redis: aioredis.Redis
    lease_seconds: float
    rebuild: Rebuild | None = None


_LIVE = """
SELECT task_id, model_name, tenant_id, state, attempt FROM asynch_task WHERE state IN (0, 1)
"""


class Rebuilder:
    def __init__(self, pool: Pool, redis: aioredis.Redis, lease_seconds: float) -> None:
        self.pool = pool
        self.redis = redis
        self.lease_seconds = lease_seconds
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        """Rebuild unless the run id is there (someone rebuilt meanwhile)."""
        async with self._lock:
            if await self.redis.exists(RUN_ID_KEY):
                return
            async with self.pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
                if await self.redis.exists(RUN_ID_KEY):
                    return
                rows = await (await conn.execute(_LIVE)).fetchall()
                now = time.time()
                pipe = self.redis.pipeline(transaction=True)
                leases = 0
                for r in rows:
                    pipe.zadd(gate_key(r["model_name"]), {r["task_id"]: now}, nx=True)
                    if r["state"] == 1:
                        member = f"{r['task_id']}:{r['attempt']}"
                        key = semaphore_key(r["model_name"], r["tenant_id"])
                        pipe.zadd(key, {member: now + self.lease_seconds}, nx=True)
                        leases += 1
                run_id = uuid.uuid4().hex
                pipe.set(RUN_ID_KEY, run_id)
                await pipe.execute()
        level = logging.WARNING if rows else logging.INFO
        log.log(
            level,
            "Redis had no asynch run id: rebuilt %d gate slots and %d semaphore leases from"
            " PostgreSQL (run %s)",
            len(rows),
            leases,
            run_id,
        )
