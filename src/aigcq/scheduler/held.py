"""Held slots: a paid remote task aigcq gave up on but could not cancel (JimuAI has no
cancel) keeps its place under the account's concurrency cap until the platform says it
ended.

A held task is a member ``held:{remoteId}`` of the target's running ZSET (so the cap's
``ZCARD`` counts it; scored by when aigcq stops waiting for it) plus an entry in
``{prefix}:held:{AIGC}:{target}`` (remoteId -> what a status query needs). The poller asks
the platform about held tasks with the task's own; once the answer is final (done, failed,
not found) the member goes and a dispatch round is woken. The slot is added before the task
leaves the running set, so the cap may count a task twice for a moment, never zero times.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from aigcq.domain import Task, TaskState
from aigcq.jsonlog import ctx
from aigcq.platforms.base import Failed, NotFound, PlatformAdapter, Succeeded
from aigcq.platforms.client import PlatformUnavailable
from aigcq.runtime import Runtime

log = logging.getLogger(__name__)

PREFIX = "held:"
#: how long a held slot waits for the platform at most (JimuAI forgets tasks after 12 h)
HOLD_MAX_S = 12 * 3600.0


def held_key(prefix: str, aigc: str, target: str) -> str:
    return f"{prefix}:held:{aigc}:{target}"


def holds(adapter: PlatformAdapter, task: Task) -> bool:
    """Whether giving up on ``task`` must hold its slot: a paid task accepted remotely by a
    platform aigcq cannot cancel."""
    return adapter.paid and bool(task.remote_id) and adapter.cancel_request(task, "") is None


async def hold(rt: Runtime, adapter: PlatformAdapter, task: Task, reason: str) -> None:
    """Keep ``task``'s slot counted until its platform reports it ended."""
    keys = rt.store.keys
    until = time.time() + HOLD_MAX_S
    entry = {
        "taskId": task.task_id,
        "platform": task.platform,
        "payload": task.payload,
        "until": until,
    }
    pipe = rt.redis.pipeline(transaction=True)
    pipe.zadd(keys.running(task.aigc, adapter.name), {PREFIX + task.remote_id: until})
    pipe.hset(held_key(keys.prefix, task.aigc, adapter.name), task.remote_id, orjson.dumps(entry))
    await pipe.execute()
    log.info(
        "task %s: %s (%s) cannot be cancelled; its slot stays held until it ends there",
        task.task_id,
        adapter.name,
        reason,
        extra=ctx(task=task.task_id),
    )


async def release(rt: Runtime, aigc: str, target: str, remote_id: str) -> None:
    keys = rt.store.keys
    pipe = rt.redis.pipeline(transaction=True)
    pipe.zrem(keys.running(aigc, target), PREFIX + remote_id)
    pipe.hdel(held_key(keys.prefix, aigc, target), remote_id)
    pipe.publish(keys.events, "wake")
    await pipe.execute()


async def poll_held(rt: Runtime, adapter: PlatformAdapter, aigc: str, platform: str) -> int:
    """Ask about every held task of one queue once; release those that ended (or that were
    held for ``HOLD_MAX_S``, after which the platform no longer knows them). Returns how
    many are still held."""
    raw: dict[Any, Any] = await rt.redis.hgetall(held_key(rt.store.keys.prefix, aigc, adapter.name))
    account = rt.config.account(aigc, platform)
    apikey = account.apikey if account else ""
    left = 0
    for remote, value in raw.items():
        remote_id = remote.decode() if isinstance(remote, bytes) else str(remote)
        entry = orjson.loads(value)
        if float(entry.get("until") or 0) < time.time():
            await release(rt, aigc, adapter.name, remote_id)
            continue
        task = Task(
            str(entry.get("taskId", "")),
            str(entry.get("platform", platform)),
            aigc,
            "",
            dict(entry.get("payload") or {}),
            state=TaskState.CANCELLED,
            target=adapter.name,
            remote_id=remote_id,
        )
        try:
            outcome = await rt.platforms.query(adapter, task, apikey)
        except PlatformUnavailable:
            left += 1
            continue
        if isinstance(outcome, Succeeded | Failed | NotFound):
            await release(rt, aigc, adapter.name, remote_id)
            log.info(
                "task %s: its held %s slot is free (%s)",
                task.task_id,
                adapter.name,
                type(outcome).__name__,
                extra=ctx(task=task.task_id),
            )
        else:
            left += 1
    return left
