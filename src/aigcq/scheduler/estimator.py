"""The Redis side of the position and ETA estimates (:mod:`aigcq.scheduler.estimates`).

:meth:`Estimator.refresh` reads what a dispatch round reads (``window.lua``:
:meth:`aigcq.queue.reads.TaskReads.window`, made the planner's inputs by
:func:`aigcq.scheduler.fair.inputs`: each waiting task's workflow mean run time,
priority credit, userId and start deadline, the tasks in flight on the internal target
of every process, the decayed usage) for the ready keys of the first
``AIGCQ_ETA_WINDOW`` users of every queue our GPUs serve (in fair order), up to
:data:`KEY_MAX` tasks of each, and the tasks with the earliest start deadlines;
and in one round trip before, the first ``AIGCQ_ETA_WINDOW`` tasks of the other queues
(by rank) and every queue's length. The pool's free slots are the internal target's,
here and in the other processes. The snapshot it makes serves every estimate until the
next refresh; a task it did not see is placed by its index in its queue (one just
submitted here: the queue's length then plus the submits here since). Bounded work per
refresh: the heads of those users' ready keys, :data:`MAX_RUNNING` tasks in flight per project,
and one read of the backendId of each task in view it has not seen before (for its
client's updates).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from redis.commands.core import AsyncScript

from aigcq.plumbing.text import text
from aigcq.queue.store import Window
from aigcq.runtime import Runtime
from aigcq.scheduler import fair
from aigcq.scheduler.estimates import UNKNOWN, Estimate, Line, Snapshot, place_new, snapshot
from aigcq.scheduler.policy import RESCUE_MAX, Pool, Queue, Shares, Tuning, Waiting
from aigcq.scheduler.targets import InternalTarget

#: tasks in flight read per project and refresh, at most
MAX_RUNNING = 4096
#: waiting tasks of each ready key a refresh reads, at most
KEY_MAX = 100

# ARGV: the key prefix, then task ids. Returns each task's backendId ('': no such task).
_OWNERS = """
local out = {}
for i = 2, #ARGV do
  out[#out + 1] = redis.call('HGET', ARGV[1] .. ':task:' .. ARGV[i], 'backendId') or ''
end
return out
"""


class Estimator:
    def __init__(self, rt: Runtime, internal: InternalTarget | None) -> None:
        self.rt, self.internal = rt, internal
        self.snapshot: Snapshot | None = None
        #: the backendId of each waiting task the last refresh saw
        self.owners: dict[str, str] = {}
        self._owners_script: AsyncScript | None = None
        #: tasks queued through this process since the last snapshot, per queue
        self.queued_since: Counter[Queue] = Counter()
        #: the ETAs have a basis: a run on our GPUs was recorded, or the operator set
        #: ``AIGCQ_SHARE_DEFAULT_RUN_S`` (else a start time is a guess: positions only)
        self.timed = False
        #: when each instance the capacity planner asked for should register (epoch s), as
        #: the dispatch rounds count them (:attr:`aigcq.scheduler.dispatch.DispatchLoop.booting`)
        self.booting: Callable[[], Sequence[float]] = lambda: ()

    async def refresh(self) -> Snapshot:
        """A new snapshot, from Redis and the internal target's capacity now; made ``at``
        the time its reads began (a task told of after that is not in it)."""
        settings, store, now = self.rt.settings, self.rt.store, time.time()
        queues = self.rt.config.queues()
        serves = set(self.internal.serves) if self.internal else set()
        served = [q for q in queues if q[1] in serves]
        others = [q for q in queues if q[1] not in serves]
        n = settings.eta_window
        heads = await store.mux.commands(
            *(["ZCARD", store.keys.wait(*q)] for q in queues),
            *(["ZRANGE", store.keys.wait(*q), 0, n - 1] for q in others),
        )
        lengths = dict(zip(queues, map(int, heads[: len(queues)]), strict=True))
        lines = [
            Line(
                q, [Waiting(text(i), q, now, 0.0) for i in ids], lengths[q], False, lengths[q] <= n
            )
            for q, ids in zip(others, heads[len(queues) :], strict=True)
        ]
        beyond, shares, tuning = settings.share_default_run_s, Shares(), Tuning(lend_s=-1)
        if served and self.internal is not None:
            window = await store.reads.window(
                served, min(n, KEY_MAX), self.internal.name, dated=RESCUE_MAX,
                busy_max=MAX_RUNNING, user_limit=settings.user_max_running,
                users_max=n, by_rank=not settings.shares,
            )  # fmt: skip
            tasks, pool, shares, tuning = self._inputs(window, now)
            self.timed = bool(window.runs) or "share_default_run_s" in settings.model_fields_set
            runs = [t.run_s for t in tasks]
            # a task queued after this read runs as long as those read, else as long as
            # the workflows we know (not the default: a burst into an empty queue was told
            # 10 s a task where the fleet's recorded runs took half a second)
            beyond = statistics.fmean(runs) if runs else fair.any_run(window.runs, beyond)
            lines += [
                Line(q, [t for t in tasks if t.queue == q], lengths[q], True, lengths[q] <= n)
                for q in served
            ]
        else:
            pool = Pool(0)
        await self._read_owners([t.task_id for line in lines for t in line.tasks])
        self.snapshot = snapshot(lines, pool, shares, now, beyond, tuning)
        self.queued_since = Counter()  # those queued while it read: in it, or a few missed
        return self.snapshot

    def _inputs(self, window: Window, now: float) -> tuple[list[Waiting], Pool, Shares, Tuning]:
        """The planner's inputs of ``window``, as a dispatch round weighs them."""
        assert self.internal is not None
        settings = self.rt.settings
        free = self.internal.free_slots() + self.internal.free_elsewhere()
        got = fair.inputs(
            window, free=free, free_elsewhere=0, settings=settings, keys=self.rt.store.keys,
            now=now, projects=self.rt.config.shares,
            booting_s=[max(at - now, 0.0) for at in self.booting()],
        )  # fmt: skip
        return got.tasks, got.pool, got.shares, fair.tuning(settings)

    async def _read_owners(self, task_ids: list[str]) -> None:
        """The backendId of each task in view, read once while it stays in view (one
        script call: no reply per task to parse)."""
        fresh = [i for i in task_ids if i not in self.owners]
        found: dict[str, str] = {}
        if fresh:
            if self._owners_script is None:
                self._owners_script = self.rt.redis.register_script(_OWNERS)
            prefix = self.rt.store.keys.prefix
            owners = await self.rt.store.mux.script(self._owners_script, [], [prefix, *fresh])
            found = {i: text(o) for i, o in zip(fresh, owners, strict=True)}
        self.owners = {i: o for i in task_ids if (o := self.owners.get(i) or found.get(i))}

    def client_of(self, task_id: str) -> str:
        """The backendId of a task the last refresh saw waiting ('': not seen)."""
        return self.owners.get(task_id, "")

    def of(self, task_id: str, queue: Queue, index: int | None) -> Estimate:
        """The estimate of a waiting task of ``queue``: the snapshot's, else by its
        ``index`` in the queue's list (None: not in the list, e.g. backing off)."""
        snap = self.snapshot
        if snap is None:
            return UNKNOWN
        known = snap.tasks.get(task_id)
        if known is None:
            known = UNKNOWN if index is None else place_new(snap, queue, index)
        return known if self.timed else replace(known, eta=None)

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
        """The estimate of a waiting task (its index by rank in its queue, ZRANK)."""
        if self.snapshot is None or task_id in self.snapshot.tasks:
            return self.of(task_id, queue, None)
        wait = self.rt.store.keys.wait(*queue)
        index = await self.rt.redis.zrank(wait, task_id)
        return self.of(task_id, queue, index if isinstance(index, int) else None)
