"""The live task list (``GET /api/admin/live-tasks``, the dashboard's "Live tasks"): the
tasks waiting and running now, where each runs (bridge and instance, or paid platform and
its remote id) and for how long, filtered by state, project, platform and target, a page
at a time.

Read-only and fleet-wide, from the keys the queue keeps: the in-flight index (tasks
dispatching or running on any process), the back-off set and each queue's wait list. Tasks
in flight and backing off are read whole (capacity bounds them; at most ``IN_FLIGHT_READ``),
five fields of each in one script; a wait list is counted by its length and read only for
the page shown, its project and platform being in its key. Only the page's tasks are read
further. In flight come first, longest in their state first; then the
tasks backing off, soonest due first; then each queue's waiting tasks, oldest first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from aigcq.bridges.registry import record_instances
from aigcq.domain import LIVE_STATES, Task, TaskState
from aigcq.plumbing.text import text
from aigcq.runtime import Runtime

#: the live states, in the order the counts list them
SHOWN = (TaskState.PENDING, TaskState.DISPATCHING, TaskState.RUNNING)
IN_FLIGHT_READ = 5000  # tasks in flight read at most (more than any fleet's capacity)
PAGE_MAX = 200

# KEYS: a ZSET of task ids. ARGV: the task key's prefix, how many ids at most. Each task's
# id, status, AIGC, platform, target and updated, in the ZSET's order (gone ones left out).
_BRIEFS = """
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)) do
  local h = redis.call('HMGET', ARGV[1] .. id, 'status', 'AIGC', 'platform', 'target', 'updated')
  if h[1] then out[#out + 1] = {id, h[1], h[2] or '', h[3] or '', h[4] or '', h[5] or '0'} end
end
return out
"""


class Placed(Protocol):
    """What a filter reads of a task: a :class:`Task`, or a :class:`Brief` of one."""

    @property
    def state(self) -> TaskState: ...
    @property
    def aigc(self) -> str: ...
    @property
    def platform(self) -> str: ...
    @property
    def target(self) -> str: ...


class Brief(NamedTuple):
    """A task in flight or backing off, as much as ordering and filtering it needs."""

    task_id: str
    state: TaskState
    aigc: str
    platform: str
    target: str
    updated_at: float


@dataclass(frozen=True, slots=True)
class LiveFilter:
    """Which live tasks to list; an empty field admits any. A waiting task runs nowhere, so
    a ``target`` admits none of them."""

    state: TaskState | None = None
    project: str = ""
    platform: str = ""
    target: str = ""

    def admits_queue(self, aigc: str, platform: str) -> bool:
        """Whether the waiting tasks of queue ``aigc`` / ``platform`` pass."""
        return (
            self.state in (None, TaskState.PENDING)
            and not self.target
            and self.project in ("", aigc)
            and self.platform in ("", platform)
        )

    def admits(self, t: Placed) -> bool:
        return (
            t.state in LIVE_STATES
            and self.state in (None, t.state)
            and self.project in ("", t.aigc)
            and self.platform in ("", t.platform)
            and self.target in ("", t.target)
        )

    def any_state(self) -> LiveFilter:
        return LiveFilter(None, self.project, self.platform, self.target)


async def live_page(rt: Runtime, wanted: LiveFilter, offset: int, limit: int) -> dict[str, Any]:
    """Page ``offset`` .. ``offset + limit`` of the live tasks ``wanted`` admits, with
    their count per state (under the other filters) and in all."""
    now, others = time.time(), wanted.any_state()
    moving = await _in_flight(rt, others)
    backing = await _delayed(rt, others)
    queues = [q for q in rt.config.queues() if others.admits_queue(*q)]
    lengths = await _lengths(rt, queues)
    counts = {s.value: sum(t.state is s for t in moving) for s in SHOWN}
    counts[TaskState.PENDING.value] += len(backing) + sum(lengths)
    listed = [t.task_id for t in moving + backing if wanted.admits(t)]
    ids = listed[offset : offset + limit]
    start, room = max(0, offset - len(listed)), limit - len(ids)
    shown = [(q, n) for q, n in zip(queues, lengths, strict=True) if wanted.admits_queue(*q)]
    ids += await _waiting(rt, shown, start, room)
    page = [t for t in await rt.store.reads.heads(ids) if wanted.admits(t)]  # as they are now
    total = counts[wanted.state.value] if wanted.state else sum(counts.values())
    return {
        "time": now,
        "offset": offset,
        "limit": limit,
        "total": total,
        "counts": counts,
        "tasks": await _rows(rt, page, {t.task_id for t in backing}, now),
    }


async def _briefs(rt: Runtime, zset: str, wanted: LiveFilter) -> list[Brief]:
    """The tasks of ``zset`` that ``wanted`` admits, in its order: one script, one trip."""
    script = rt.redis.register_script(_BRIEFS)
    rows = await script(keys=[zset], args=[rt.store.keys.task(""), IN_FLIGHT_READ])
    briefs = [
        Brief(text(i), TaskState(text(s)), text(a), text(p), text(t), float(u))
        for i, s, a, p, t, u in rows
    ]
    return [b for b in briefs if wanted.admits(b)]


async def _in_flight(rt: Runtime, wanted: LiveFilter) -> list[Brief]:
    tasks = await _briefs(rt, rt.store.keys.inflight, wanted)
    return sorted(tasks, key=lambda t: t.updated_at)


async def _delayed(rt: Runtime, wanted: LiveFilter) -> list[Brief]:
    """Pending tasks backing off, soonest due first (their wait list holds them later)."""
    return await _briefs(rt, rt.store.keys.delayed, wanted)


async def _lengths(rt: Runtime, queues: list[tuple[str, str]]) -> list[int]:
    pipe = rt.redis.pipeline(transaction=False)
    for aigc, platform in queues:
        pipe.zcard(rt.store.keys.wait(aigc, platform))
    return [int(n) for n in await pipe.execute()]


async def _waiting(
    rt: Runtime, queues: list[tuple[tuple[str, str], int]], start: int, room: int
) -> list[str]:
    """``room`` waiting tasks' ids from position ``start`` of the wait lists laid end to
    end."""
    ids: list[str] = []
    for (aigc, platform), length in queues:
        if room <= len(ids):
            break
        if start >= length:
            start -= length
            continue
        end = start + room - len(ids) - 1
        found = await rt.redis.zrange(rt.store.keys.wait(aigc, platform), start, end)
        ids += [text(i) for i in found]
        start = 0
    return ids


async def _rows(
    rt: Runtime, tasks: list[Task], backing: set[str], now: float
) -> list[dict[str, Any]]:
    """The page's rows; ``backing``: the ids of tasks backing off before a retry."""
    placed = await _bridge_instances(rt, [t for t in tasks if t.state is not TaskState.PENDING])
    return [
        {
            "taskId": t.task_id,
            "state": t.state.value,
            "AIGC": t.aigc,
            "platform": t.platform,
            "backendId": t.backend_id,
            "target": t.target,
            "bridge": placed.get(t.task_id, ("", ""))[0],
            "instance": placed.get(t.task_id, ("", ""))[1],
            "remoteTaskId": t.remote_id,
            "attempt": t.attempt,
            "backingOff": t.task_id in backing,
            "created": t.created_at,
            "since": t.updated_at,
            "ageS": round(now - t.created_at, 1),
            "inStateS": round(now - t.updated_at, 1),
        }
        for t in tasks
    ]


async def _bridge_instances(rt: Runtime, tasks: list[Task]) -> dict[str, tuple[str, str]]:
    """taskId -> (the bridge holding it, the instance its bridge reports running it), for
    the tasks a bridge acknowledged (any process's)."""
    keys = rt.store.keys
    pipe = rt.redis.pipeline(transaction=False)
    for t in tasks:
        pipe.hgetall(keys.bridges_of(t.task_id))
    holders = {
        t.task_id: _latest(held)
        for t, held in zip(tasks, await pipe.execute(), strict=True)
        if held
    }
    bridges = sorted(set(holders.values()))
    pipe = rt.redis.pipeline(transaction=False)
    for bridge_id in bridges:
        pipe.hget(keys.bridge(bridge_id), "instances")
    instance_of: dict[str, str] = {}
    for raw in await pipe.execute():
        for instance in record_instances(raw):
            if instance.get("taskId"):
                instance_of[str(instance["taskId"])] = str(instance.get("instanceId", ""))
    return {task_id: (b, instance_of.get(task_id, "")) for task_id, b in holders.items()}


def _latest(held: dict[Any, Any]) -> str:
    """Of a task's ``bridgesof`` hash (bridgeId -> attempt), the bridge of its latest
    attempt (a superseded one may still be stopping on another)."""
    return text(max(held.items(), key=lambda item: int(item[1]))[0])
