"""Queue shrink (seed 000 §9.4.1): hand back the pending tasks that lost instances left
without a place, so their queue backends route them again (to RunningHub when short).

When the online instances go down (the :class:`CapacityFeed`'s ``on_shrink``), the tasks still
waiting beyond what is left (``excess = pending − online instances``; a task within that
runs here as soon as an instance frees, seed §10 scenarios 1 and 2) are handed back,
newest first. Only a task that a backend submitted with a ``webhookUrl`` and allocated
(``TASK_ALLOCATION``) on a capacity feed connection that is still open is handed back: it
leaves this queue atomically, and only while it is still waiting — a task a bridge has
started is never handed back — as ``cancelled`` with no ``TASK_END`` (its submitter runs
it elsewhere), then ``TASK_DEGRADE`` names it to that backend. A task whose notice could
not be sent is queued here again. Tasks of backends not on the feed stay pending: they
run when an instance frees, or expire after ``AIGCQ_MD_STALE_AFTER_S``.

A handed-back task is unknown (``807``) to the RunningHub-compatible queries, so a backend
that missed the notice retries it at its deadline rather than failing it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from aigcq.dispatcher.capacity import CapacityFeed
from aigcq.domain import Task, TaskState
from aigcq.queue.store import task_from_hash
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle

log = logging.getLogger(__name__)

#: ``error.code`` of a task handed back to its backend
HANDED_BACK = "HandedBack"


def handed_back(task: Task) -> bool:
    error = task.error if isinstance(task.error, dict) else {}
    return task.state is TaskState.CANCELLED and error.get("code") == HANDED_BACK


@dataclass(eq=False)
class Degrader:
    """Hands the waiting tasks that lost instances left without a place back."""

    lifecycle: Lifecycle
    queue: tuple[str, str]
    feed: CapacityFeed

    @property
    def rt(self) -> Runtime:
        return self.lifecycle.rt

    async def shrink(self, capacity: int) -> int:
        """Hand back the waiting tasks beyond ``capacity``; how many were handed back."""
        keys, redis = self.rt.store.keys, self.rt.redis
        pipe = redis.pipeline(transaction=False)
        pipe.zrange(keys.wait(*self.queue), 0, -1)
        pipe.zrange(keys.delayed, 0, -1)
        waiting, delayed = await pipe.execute()
        ids = list(dict.fromkeys([*waiting, *delayed]))
        excess = len(ids) - max(capacity, 0)
        if excess <= 0:
            return 0
        owned = [(t, owner) for t in await self._tasks(ids) if (owner := self._owner(t))]
        owned.sort(key=lambda pair: pair[0].created_at, reverse=True)  # newest first
        by_owner: dict[str, list[Task]] = defaultdict(list)
        for task, owner in owned[:excess]:
            if await self.lifecycle.withdrawn(
                task.task_id,
                error={"code": HANDED_BACK, "message": "handed back to its queue backend"},
                note=f"handed back to {owner} (instances lost)",
            ):
                by_owner[owner].append(task)
        handed = 0
        for owner, tasks in by_owner.items():
            entries = [_entry(t) for t in tasks]
            if await self.feed.notify(owner, entries, excess=excess, reason="instances lost"):
                handed += len(tasks)
                log.warning("handed %d tasks back to %s", len(tasks), owner)
                continue
            for t in tasks:  # the notice did not go out: keep running them here
                await self.lifecycle.restored(t.task_id, "degrade notice not sent")
        log.info("%d tasks beyond %d instances, %d handed back", excess, capacity, handed)
        return handed

    def _owner(self, task: Task) -> str | None:
        hook = task.payload.get("webhookUrl")
        if task.state is not TaskState.PENDING or not (isinstance(hook, str) and hook):
            return None
        return self.feed.owner(task.task_id)

    async def _tasks(self, ids: list[str]) -> list[Task]:
        pipe = self.rt.redis.pipeline(transaction=False)
        for task_id in ids:
            pipe.hgetall(self.rt.store.keys.task(task_id))
        return [task_from_hash(raw) for raw in await pipe.execute() if raw]


def _entry(t: Task) -> dict[str, Any]:
    return {"taskId": t.task_id, "webhookUrl": t.payload.get("webhookUrl"), "attempt": t.attempt}
