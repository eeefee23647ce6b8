"""Finding tasks by filter: the operator's list (``GET /api/admin/tasks``, ``aigcq tasks
list``).

Redis indexes tasks by where they are, not by their fields: the live ones are in their
queues' wait lists, the delayed set (backing off) and the in-flight set, the finished ones in
the recent list (the last 1000 to finish, while retained). A listing reads the ids of the
places its states can be in, then each task's small fields (pipelined HMGETs), and filters
those here. It costs a read per live task and per recent one, whatever the filter: an
operator's call, not a hot path.
"""

from __future__ import annotations

from dataclasses import dataclass

from aigcq.domain import LIVE_STATES, TERMINAL_STATES, Task, TaskState
from aigcq.plumbing.text import text
from aigcq.queue.store import TaskStore

_PAGE = 500  # task ids per pipelined read


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """What a listed task must match; an empty field matches any task."""

    states: frozenset[TaskState] = frozenset()
    aigc: str = ""
    platform: str = ""
    backend_id: str = ""
    target: str = ""
    #: its last transition at or after this time (epoch seconds; 0: any)
    since: float = 0.0

    def matches(self, task: Task) -> bool:
        fields = (
            (self.aigc, task.aigc),
            (self.platform, task.platform),
            (self.backend_id, task.backend_id),
            (self.target, task.target),
        )
        return (
            (not self.states or task.state in self.states)
            and all(not want or want == have for want, have in fields)
            and task.updated_at >= self.since
        )


async def find_tasks(store: TaskStore, wanted: TaskFilter) -> list[Task]:
    """Every task ``wanted`` matches, the latest to change first (payload and result
    left empty)."""
    found: list[Task] = []
    ids = await _candidates(store, wanted.states or LIVE_STATES | TERMINAL_STATES)
    for start in range(0, len(ids), _PAGE):
        found += [t for t in await store.summaries(ids[start : start + _PAGE]) if wanted.matches(t)]
    return sorted(found, key=lambda t: (t.updated_at, t.task_id), reverse=True)


async def _candidates(store: TaskStore, states: frozenset[TaskState]) -> list[str]:
    """The ids of the tasks that may be in ``states``, each once (a task moving between two
    reads may be missed or read twice: each is read once, then filtered by its state)."""
    redis, keys = store.redis, store.keys
    ids: list[str] = []
    if TaskState.PENDING in states:
        for queue in sorted(text(q) for q in await redis.smembers(keys.queues)):
            aigc, _, platform = queue.rpartition(":")
            ids += [text(i) for i in await redis.lrange(keys.wait(aigc, platform), 0, -1)]
        ids += [text(i) for i in await redis.zrange(keys.delayed, 0, -1)]
    if states & {TaskState.DISPATCHING, TaskState.RUNNING}:
        ids += await store.in_flight()
    if states & TERMINAL_STATES:
        ids += [text(i) for i in await redis.lrange(keys.recent, 0, -1)]
    return list(dict.fromkeys(ids))
