"""Finding tasks by filter: the operator's list (``GET /api/admin/tasks``, ``aigcq tasks
list``) and the controls by filter (:mod:`aigcq.serve.by_filter`: ``aigcq tasks cancel`` /
``tasks retry`` with filters).

Redis indexes tasks by where they are, not by their fields: the live ones are in their
queues' wait lists, the delayed set (backing off) and the in-flight set; the failed and
cancelled ones in the set of replayable ends; every finished one in the recent list (the
last 1000 to finish, while retained). A search reads the ids of the places its states can
be in, then each task's small fields (pipelined HMGETs, a page at a time), and filters
those here. It costs a read per candidate task, whatever the filter: an operator's call,
not a hot path.
"""

from __future__ import annotations

from dataclasses import dataclass

from aigcq.domain import LIVE_STATES, TERMINAL_STATES, Task, TaskState
from aigcq.plumbing.text import text
from aigcq.queue.store import TaskStore

PAGE = 500  # tasks read per pipeline
#: every state: what a filter naming no state admits
ANY_STATE = frozenset(LIVE_STATES | TERMINAL_STATES)
#: the ends kept in the set of replayable ends
REPLAYABLE = frozenset({TaskState.FAILED, TaskState.CANCELLED})


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks a search admits; an empty field admits any."""

    states: frozenset[TaskState] = ANY_STATE
    project: str = ""  # AIGC
    platform: str = ""
    client: str = ""  # backendId
    target: str = ""
    #: its last change at or after this time (epoch seconds; 0: any)
    since: float = 0.0

    def admits(self, t: Task) -> bool:
        pairs = (
            (self.project, t.aigc),
            (self.platform, t.platform),
            (self.client, t.backend_id),
            (self.target, t.target),
        )
        return (
            t.state in self.states
            and all(want in ("", have) for want, have in pairs)
            and t.updated_at >= self.since
        )

    def admits_queue(self, aigc: str, platform: str) -> bool:
        return self.project in ("", aigc) and self.platform in ("", platform)


async def find_tasks(store: TaskStore, wanted: TaskFilter) -> list[Task]:
    """Every task ``wanted`` admits, the longest unchanged first (payload and result left
    empty; the error is read)."""
    found: list[Task] = []
    ids = await _candidates(store, wanted)
    for start in range(0, len(ids), PAGE):
        found += [t for t in await store.reads.heads(ids[start : start + PAGE]) if wanted.admits(t)]
    return sorted(found, key=lambda t: (t.updated_at, t.task_id))


async def _candidates(store: TaskStore, wanted: TaskFilter) -> list[str]:
    """The ids of the tasks that may be in ``wanted``'s states, each once (a task moving
    meanwhile may be read twice or missed; each is read, then filtered, once)."""
    redis, keys, states = store.redis, store.keys, wanted.states
    pipe = redis.pipeline(transaction=False)
    if TaskState.PENDING in states:
        for queue in sorted(text(q) for q in await redis.smembers(keys.queues)):
            aigc, _, platform = queue.rpartition(":")
            if wanted.admits_queue(aigc, platform):
                pipe.zrange(keys.wait(aigc, platform), 0, -1)
        pipe.zrange(keys.delayed, 0, -1)
    if states & REPLAYABLE:
        pipe.zrangebyscore(keys.replayable, wanted.since, "+inf")
    if states & TERMINAL_STATES:
        pipe.lrange(keys.recent, 0, -1)
    lists = await pipe.execute()
    if states & {TaskState.DISPATCHING, TaskState.RUNNING}:
        lists.append(await store.reads.in_flight())
    return list(dict.fromkeys(text(i) for ids in lists for i in ids))
