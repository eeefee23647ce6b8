"""The Redis side of the position and ETA estimates (:mod:`aigcq.scheduler.estimates`).

:meth:`Estimator.refresh` reads, in two round trips on the hot-path connection, the head
of every configured queue (``AIGCQ_ETA_WINDOW`` ids and its length), the tasks in flight
on the internal target (every process's: ``running:{AIGC}:{target}``), each workflow's
recent mean run time (:mod:`aigcq.scheduler.run_means`), and the small fields of the tasks
it has not seen before (one read-only script; kept in memory while they stay in view);
the internal pool's free slots are the internal target's, here and in the other
processes. The snapshot it makes serves every estimate until the next refresh; a task it
did not see is placed by its index in its queue (one just submitted here: the queue's
length then plus the submits here since). Bounded work per refresh: at most the window per
queue, and :data:`MAX_RUNNING` tasks in flight per project.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass

from redis.commands.core import AsyncScript

from aigcq.plumbing.text import text
from aigcq.runtime import Runtime
from aigcq.scheduler.estimates import (
    UNKNOWN,
    Estimate,
    Line,
    Snapshot,
    busy_left,
    place_new,
    snapshot,
)
from aigcq.scheduler.policy import Pool, Queue, Shares
from aigcq.scheduler.run_means import parse_means
from aigcq.scheduler.targets import InternalTarget

#: tasks in flight read per project and refresh, at most
MAX_RUNNING = 4096

# ARGV: the key prefix, the field of the task's time, then task ids. Returns, flat, each
# task's workflowId, that time and backendId ('' each: no such task). Read only.
_FIELDS = """
local out = {}
for i = 3, #ARGV do
  local f = redis.call('HMGET', ARGV[1] .. ':task:' .. ARGV[i], 'workflowId', ARGV[2], 'backendId')
  out[#out + 1] = f[1] or ''
  out[#out + 1] = f[2] or ''
  out[#out + 1] = f[3] or ''
end
return out
"""


@dataclass(frozen=True, slots=True)
class Seen:
    """What an estimate needs of a task, read once."""

    workflow: str
    #: when it was submitted (waiting), or last dispatched or started (in flight), epoch s
    since: float
    backend_id: str


class Estimator:
    def __init__(self, rt: Runtime, internal: InternalTarget | None) -> None:
        self.rt, self.internal = rt, internal
        self.snapshot: Snapshot | None = None
        #: the waiting tasks and the tasks in flight the last refresh saw
        self.waiting: dict[str, Seen] = {}
        self.running: dict[str, Seen] = {}
        self._fields_script: AsyncScript | None = None
        #: tasks queued through this process since the last snapshot, per queue
        self.queued_since: Counter[Queue] = Counter()

    async def refresh(self) -> Snapshot:
        """A new snapshot, from Redis and the internal target's capacity now; made ``at``
        the time its reads began (a task told of after that is not in it)."""
        keys, settings, now = self.rt.store.keys, self.rt.settings, time.time()
        queues = self.rt.config.queues()
        serves = set(self.internal.serves) if self.internal else set()
        projects = sorted({aigc for aigc, platform in queues if platform in serves})
        target = self.internal.name if self.internal else ""
        replies = await self.rt.store.mux.commands(
            *(
                cmd
                for aigc, platform in queues
                for cmd in (
                    ["LRANGE", keys.wait(aigc, platform), 0, settings.eta_window - 1],
                    ["LLEN", keys.wait(aigc, platform)],
                )
            ),
            *(["ZRANGE", keys.running(aigc, target), 0, MAX_RUNNING - 1] for aigc in projects),
            ["HGETALL", keys.run_means],
        )
        means = parse_means(replies.pop())
        heads = [[text(i) for i in ids] for ids in replies[0 : 2 * len(queues) : 2]]
        running = [text(i) for ids in replies[2 * len(queues) :] for i in ids]
        await self._read([i for ids in heads for i in ids], running)
        seen = self.waiting
        default = settings.eta_default_run_s
        lines = [
            Line(
                queue,
                ids,
                [seen[i].since if i in seen else now for i in ids],
                [means.get(seen[i].workflow, default) if i in seen else default for i in ids],
                int(replies[2 * n + 1]),
                queue[1] in serves,
            )
            for n, (queue, ids) in enumerate(zip(queues, heads, strict=True))
        ]
        busy = busy_left(
            [(r.workflow, r.since) for r in self.running.values()], means, default, now
        )
        free = self.internal.free_slots() + self.internal.free_elsewhere() if self.internal else 0
        runs = [r for line in lines if line.served for r in line.run_s]
        beyond = statistics.fmean(runs) if runs else default
        self.snapshot = snapshot(lines, Pool(free, 0, busy), Shares(), now, beyond)
        self.queued_since = Counter()  # those queued while it read: in it, or a few missed
        return self.snapshot

    async def _read(self, waiting: list[str], running: list[str]) -> None:
        """:class:`Seen` of each task in view (those that still exist), read once while it
        stays waiting, and once while it stays in flight."""
        fresh = [i for i in waiting if i not in self.waiting]
        fresh_running = [i for i in running if i not in self.running]
        found = await self._fields(fresh, since="created")
        found_running = await self._fields(fresh_running, since="updated")
        self.waiting = {i: s for i in waiting if (s := self.waiting.get(i) or found.get(i))}
        self.running = {i: s for i in running if (s := self.running.get(i) or found_running.get(i))}

    async def _fields(self, task_ids: list[str], *, since: str) -> dict[str, Seen]:
        """The fields of :class:`Seen`, ``since`` for its time, of each task that exists
        (one script call: no reply per task to parse in Python)."""
        if not task_ids:
            return {}
        if self._fields_script is None:
            self._fields_script = self.rt.redis.register_script(_FIELDS)
        prefix = self.rt.store.keys.prefix
        flat = await self.rt.store.mux.script(self._fields_script, [], [prefix, since, *task_ids])
        rows = zip(task_ids, flat[0::3], flat[1::3], flat[2::3], strict=True)
        return {
            task_id: Seen(text(workflow), float(text(at)), text(backend))
            for task_id, workflow, at, backend in rows
            if text(at)
        }

    def client_of(self, task_id: str) -> str:
        """The backendId of a task the last refresh saw waiting ('': not seen)."""
        seen = self.waiting.get(task_id)
        return seen.backend_id if seen else ""

    def of(self, task_id: str, queue: Queue, index: int | None) -> Estimate:
        """The estimate of a waiting task of ``queue``: the snapshot's, else by its
        ``index`` in the queue's list (None: not in the list, e.g. backing off)."""
        snap = self.snapshot
        if snap is None:
            return UNKNOWN
        known = snap.tasks.get(task_id)
        if known is not None:
            return known
        return UNKNOWN if index is None else place_new(snap, queue, index)

    def of_submitted(self, task_id: str, queue: Queue) -> Estimate:
        """The estimate of a task just queued at the tail of ``queue``, with no I/O (a
        round trip more would hold every submit reply): its index is the queue's length
        at the snapshot plus the tasks queued here since (those queued by other processes
        meanwhile are not counted, nor those that left; the next refresh sees them)."""
        if self.snapshot is None:
            return UNKNOWN
        index = self.snapshot.lengths.get(queue, 0) + self.queued_since[queue]
        self.queued_since[queue] += 1
        return self.of(task_id, queue, index)

    async def of_waiting(self, task_id: str, queue: Queue) -> Estimate:
        """The estimate of a waiting task (its index read with LPOS within the window)."""
        if self.snapshot is None or task_id in self.snapshot.tasks:
            return self.of(task_id, queue, None)
        wait = self.rt.store.keys.wait(*queue)
        index = await self.rt.redis.lpos(wait, task_id, maxlen=self.rt.settings.eta_window)
        return self.of(task_id, queue, index if isinstance(index, int) else None)
