"""Result polling for platforms of ``kind`` polling: batches of 100, adaptive interval.

Only one process polls a platform at a time (a short Redis lock per round); the others
skip. Settling is idempotent, so a lost lock only costs a duplicate query.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aigcq.domain import TaskState
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import PlatformAdapter, Unknown
from aigcq.plumbing.background import one_round
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle

log = logging.getLogger(__name__)

#: how many polling tasks one round queries at most (seed 001 §5B.2).
POLL_BATCH = 100
MIN_POLL_S, MAX_POLL_S = 5.0, 30.0
#: in-flight tasks at which polling reaches its fastest pace.
BUSY_IN_FLIGHT = 50


def next_poll_interval(in_flight: int) -> float:
    """Seconds until the next polling round, 5–30 s, shorter when more tasks are in flight
    (seed 001 §5B.1, the same rule for every polling platform).

    ``30 - 25 * min(in_flight, 50) / 50``: 30 s with nothing in flight, 5 s from 50 tasks
    on, linear in between (so more tasks, and so more results due, are checked more often).
    """
    load = min(max(in_flight, 0), BUSY_IN_FLIGHT) / BUSY_IN_FLIGHT
    return MAX_POLL_S - (MAX_POLL_S - MIN_POLL_S) * load


@dataclass(eq=False)
class Poller:
    rt: Runtime
    lifecycle: Lifecycle
    adapter: PlatformAdapter

    async def run(self) -> None:
        while True:
            polled = 0
            with one_round(log, f"{self.adapter.name}: polling round failed"):
                polled = await self.poll_once()
            fixed = self.rt.settings.poll_interval_s
            await asyncio.sleep(fixed if fixed is not None else next_poll_interval(polled))

    def _queues(self) -> list[tuple[str, str]]:
        return [(a, p) for a, p in self.rt.config.queues() if p in self.adapter.serves]

    async def poll_once(self) -> int:
        """Query every running task once; returns how many were in flight."""
        keys = self.rt.store.keys
        queues = self._queues()
        if not queues:  # nothing configured for this platform: no lock, no Redis traffic
            return 0
        lock = keys.poll_lock(self.adapter.name)
        if not await self.rt.redis.set(lock, "1", nx=True, px=2000):
            return 0
        try:
            pairs: list[tuple[str, str, str]] = []
            for aigc, platform in queues:
                polling = await self.rt.redis.hgetall(keys.polling(aigc, platform))
                pairs += [(aigc, platform, str(tid)) for tid in polling.values()]
            for start in range(0, len(pairs), POLL_BATCH):
                batch = pairs[start : start + POLL_BATCH]
                await asyncio.gather(*(self._poll(a, p, t) for a, p, t in batch))
            return len(pairs)
        finally:
            await self.rt.redis.delete(lock)

    async def _poll(self, aigc: str, platform: str, task_id: str) -> None:
        task = await self.rt.store.reads.get(task_id)
        if task is None or task.state is not TaskState.RUNNING:
            return
        apikey = self.rt.apikey(aigc, platform)
        outcome = await self.rt.platforms.query(self.adapter, task, apikey)
        if isinstance(outcome, Unknown):  # asked again next round; worth a look if it lasts
            log.warning(
                "task %s: no usable answer from %s: %s",
                task_id,
                self.adapter.name,
                outcome.reason,
                extra=ctx(task=task_id),
            )
            return
        note = f"polled {self.adapter.name}"
        await self.lifecycle.settle(task_id, outcome, note, task.attempt, target=task.target)


def polling_adapters(rt: Runtime) -> list[PlatformAdapter]:
    """The polling platforms that serve a configured queue (each gets a :class:`Poller`)."""
    platforms = {platform for _, platform in rt.config.queues()}
    return [
        a
        for a in rt.platforms.adapters.values()
        if a.kind == "polling" and platforms & set(a.serves)
    ]
