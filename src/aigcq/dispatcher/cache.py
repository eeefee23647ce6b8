"""The message-dispatcher's cache queue (seed 000 §9) on top of aigcq's own queue.

The queue itself is aigcq's: the wait list ``{prefix}:api:comfyui:wait`` (plus tasks backing
off in ``{prefix}:delayed``) is the pending cache, the hub's running set is the processing
one. Every ``interval_s`` this loop

- fails pending tasks older than ``stale_after_s`` (30 min); finishing them sends the
  failure to their ``webhookUrl`` like any other result;
- rewrites the seed's keys as read-only **mirrors** of that state: ``{prefix}:cache:pending``
  (list of ``{taskId, payload, submittedAt, retryCount}``), ``{prefix}:cache:processing``
  (hash taskId → ``{instanceId, bridgeId, startTime, payload}``, instances as numbered by
  the capacity feed) and ``{prefix}:cache:completed`` (list of ``{taskId, status,
  completedAt}``, the last 1000, newest first). Writing to them changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime

import orjson

from aigcq.domain import Task, TaskState
from aigcq.plumbing.background import every
from aigcq.queue.store import task_from_hash
from aigcq.runtime import Runtime
from aigcq.scheduler.deadlines import TaskDeadlines
from aigcq.scheduler.lifecycle import Lifecycle

log = logging.getLogger(__name__)

COMPLETED_KEPT = 1000
EXPIRED = "TaskExpired"

#: taskId -> (bridgeId, instanceId, startTime) of the tasks on the bridges
Placed = Callable[[], dict[str, tuple[str, str, str | None]]]


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")


@dataclass(eq=False)
class CacheQueue:
    """Expires stale pending tasks and mirrors the queue into the seed's cache keys."""

    rt: Runtime
    lifecycle: Lifecycle
    queue: tuple[str, str]
    hub_name: str
    placed: Placed
    _: KW_ONLY
    stale_after_s: float
    interval_s: float = 5.0
    pending_key: str = field(init=False)
    processing_key: str = field(init=False)
    completed_key: str = field(init=False)

    def __post_init__(self) -> None:
        keys = self.rt.store.keys
        self.pending_key = keys.cache_pending
        self.processing_key = keys.cache_processing
        self.completed_key = keys.cache_completed
        self.deadlines = TaskDeadlines(self.lifecycle)

    async def run(self) -> None:
        await every(self.interval_s, self.pass_once, log, "cache queue pass failed")

    async def pass_once(self) -> None:
        keys, redis = self.rt.store.keys, self.rt.redis
        pipe = redis.pipeline(transaction=False)
        pipe.zrange(keys.wait(*self.queue), 0, -1)
        pipe.zrange(keys.delayed, 0, -1)
        pipe.zrange(keys.running(self.queue[0], self.hub_name), 0, -1)
        pipe.lrange(keys.recent, 0, COMPLETED_KEPT - 1)
        waiting, delayed, running, recent = await pipe.execute()
        queued = await self._tasks([*waiting, *delayed])
        pending = [t for t in queued if t.state is TaskState.PENDING and not await self._expired(t)]
        await self._mirror(pending, await self._tasks(running), await self._tasks(recent))

    async def _expired(self, task: Task) -> bool:
        """Fail ``task`` when it has waited longer than ``stale_after_s``."""
        waited = time.time() - task.created_at
        if waited < self.stale_after_s:
            return False
        message = f"pending for {waited:.0f} s"
        await TaskDeadlines(self.lifecycle).expired(
            task, EXPIRED, message, "expired in the cache queue"
        )
        return True

    async def _tasks(self, ids: list[str]) -> list[Task]:
        pipe = self.rt.redis.pipeline(transaction=False)
        for task_id in ids:
            pipe.hgetall(self.rt.store.keys.task(task_id))
        return [task_from_hash(raw) for raw in await pipe.execute() if raw]

    async def _mirror(self, pending: list[Task], running: list[Task], done: list[Task]) -> None:
        placed = self.placed()
        pipe = self.rt.redis.pipeline(transaction=True)
        pipe.delete(self.pending_key, self.processing_key, self.completed_key)
        if pending:
            pipe.rpush(self.pending_key, *map(_pending_entry, pending))
        if running:
            pipe.hset(
                self.processing_key,
                mapping={t.task_id: _processing_entry(t, placed.get(t.task_id)) for t in running},
            )
        if done:
            pipe.rpush(self.completed_key, *map(_completed_entry, done))
        await pipe.execute()


def _pending_entry(t: Task) -> bytes:
    return orjson.dumps(
        {
            "taskId": t.task_id,
            "payload": t.payload,
            "submittedAt": iso(t.created_at),
            "retryCount": t.attempt,
        }
    )


def _processing_entry(t: Task, where: tuple[str, str, str | None] | None) -> bytes:
    bridge_id, instance_id, started = where or (None, None, None)
    return orjson.dumps(
        {
            "instanceId": instance_id,
            "bridgeId": bridge_id,
            "startTime": started or iso(t.updated_at),
            "payload": t.payload,
        }
    )


def _completed_entry(t: Task) -> bytes:
    return orjson.dumps(
        {"taskId": t.task_id, "status": t.state.value, "completedAt": iso(t.updated_at)}
    )
