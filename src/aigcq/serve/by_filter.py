"""Cancel and replay tasks by filter: ``POST /api/admin/tasks/cancel`` and
``POST /api/admin/tasks/replay`` (``aigcq tasks cancel`` / ``aigcq tasks retry --failed``
with filters).

A filter names states, a project (AIGC), a platform, a client (backendId), a target and a
time: the task's last change at or after it (when it started waiting or running, or when
it ended). An empty field admits any task, but a filter names at least one field: a
control never acts on every task unasked. Tasks are found where the queue keeps them (live
ones in the wait lists, the back-off set and the in-flight set; failed and cancelled ones
in the set of replayable ends, and the recent list for those that ended before it
existed), then read, a page at a time, and acted on through the lifecycle as one task's
cancel or retry is: a cancel stops its run (a paid remote task is cancelled there), a
replay never pays a platform twice (:meth:`Lifecycle.retried_by_operator`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from aigcq.domain import LIVE_STATES, Task, TaskState
from aigcq.plumbing.text import text
from aigcq.queue.store import Retried
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle

PAGE = 500  # tasks read per pipeline
AT_ONCE = 50  # tasks acted on concurrently
#: the states a cancel and a replay act on
CANCELLABLE = frozenset(LIVE_STATES)
REPLAYABLE = frozenset({TaskState.FAILED, TaskState.CANCELLED})


class FilterError(ValueError):
    """A filter that names an unknown state, project, platform or target, or nothing."""


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks a control acts on; an empty field admits any."""

    states: frozenset[TaskState]
    project: str = ""
    platform: str = ""
    client: str = ""
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


def task_filter(
    rt: Runtime,
    targets: Iterable[str],
    *,
    acts_on: frozenset[TaskState],
    default: frozenset[TaskState],
    state: str = "",
    **wanted: Any,
) -> TaskFilter:
    """A filter from its fields (``state``: states, comma-separated; else ``default``),
    each checked against what is configured; :class:`FilterError` saying what is known."""
    given = {k: v for k, v in wanted.items() if v}
    if not state and not given:
        names = ", ".join(f.name for f in fields(TaskFilter) if f.name != "states")
        raise FilterError(f"name at least one filter (state, {names})")
    states = _states(state, acts_on) if state else default
    known = {
        "project": sorted(rt.config.accounts),
        "platform": sorted({p for _, p in rt.config.queues()}),
        "target": sorted(targets),
    }
    for name, values in known.items():
        value = given.get(name)
        if value is not None and value not in values:
            raise FilterError(f"no {name} {value!r} (known: {', '.join(values) or 'none'})")
    return TaskFilter(states, **wanted)


def _states(names: str, acts_on: frozenset[TaskState]) -> frozenset[TaskState]:
    allowed = sorted(s.value for s in acts_on)
    found = set()
    for word in filter(None, (w.strip().lower() for w in names.split(","))):
        if word not in allowed:
            raise FilterError(f"state {word!r}: this acts on {', '.join(allowed)}")
        found.add(TaskState(word))
    if not found:
        raise FilterError(f"state: name one of {', '.join(allowed)}")
    return frozenset(found)


async def find(rt: Runtime, wanted: TaskFilter) -> list[Task]:
    """Every task ``wanted`` admits, the longest unchanged first (payload, result left out)."""
    found: list[Task] = []
    ids = await _candidates(rt, wanted)
    for start in range(0, len(ids), PAGE):
        found += [t for t in await rt.store.heads(ids[start : start + PAGE]) if wanted.admits(t)]
    return sorted(found, key=lambda t: (t.updated_at, t.task_id))


async def _candidates(rt: Runtime, wanted: TaskFilter) -> list[str]:
    """The ids of the tasks that may be in ``wanted``'s states, each once (a task moving
    meanwhile may be read twice or missed; each is read, then filtered, once)."""
    redis, keys, states = rt.redis, rt.store.keys, wanted.states
    pipe = redis.pipeline(transaction=False)
    if TaskState.PENDING in states:
        for aigc, platform in rt.config.queues():
            if wanted.project in ("", aigc) and wanted.platform in ("", platform):
                pipe.lrange(keys.wait(aigc, platform), 0, -1)
        pipe.zrange(keys.delayed, 0, -1)
    if states & REPLAYABLE:
        pipe.zrangebyscore(keys.replayable, wanted.since, "+inf")
        pipe.lrange(keys.recent, 0, -1)
    lists = await pipe.execute()
    if states & {TaskState.DISPATCHING, TaskState.RUNNING}:
        lists.append(await rt.store.in_flight())
    return list(dict.fromkeys(text(i) for ids in lists for i in ids))


async def cancel_matching(
    lifecycle: Lifecycle, wanted: TaskFilter, *, limit: int, dry_run: bool
) -> dict[str, Any]:
    """Cancel the first ``limit`` live tasks ``wanted`` admits (as an operator)."""
    tasks = await find(lifecycle.rt, wanted)
    answer = _answer(tasks, limit, dry_run, cancelled=[])
    if not dry_run:

        async def cancel(t: Task) -> None:
            done = await lifecycle.cancelled(t, by_client=False)
            if done.applied:
                answer["cancelled"].append(t.task_id)
            else:
                answer["skipped"].append({"taskId": t.task_id, "reason": f"already {done.state}"})

        await _each(tasks[:limit], cancel, answer)
    return answer


async def replay_matching(
    lifecycle: Lifecycle, wanted: TaskFilter, *, limit: int, dry_run: bool
) -> dict[str, Any]:
    """Replay the first ``limit`` failed (or cancelled) tasks ``wanted`` admits: each is
    queued again, or given the result its paid run brought after it ended, or left as it
    is while a paid run of it may still be out."""
    tasks = await find(lifecycle.rt, wanted)
    answer = _answer(tasks, limit, dry_run, queued=[], delivered=[])
    if not dry_run:

        async def replay(t: Task) -> None:
            done = await lifecycle.retried_by_operator(t.task_id)
            if done.applied:
                answer["delivered" if done.kept_result else "queued"].append(t.task_id)
            else:
                answer["skipped"].append({"taskId": t.task_id, "reason": not_retried(done)})

        await _each(tasks[:limit], replay, answer)
    return answer


def not_retried(done: Retried) -> str:
    """Why a task was neither queued again nor given a kept result."""
    if done.paid_out:
        return (
            f"a paid run of it may still be out ({done.paid_out}): retry it once that ends "
            "(a result it brings is then delivered, not paid for again)"
        )
    return f"a {done.state} task cannot be retried" if done.state else "no such task"


def _answer(tasks: list[Task], limit: int, dry_run: bool, **outcomes: list[str]) -> dict[str, Any]:
    """What a control answers: how many tasks matched, the ids of those it takes (at most
    ``limit``; ``more``: others matched), what it did with each."""
    return {
        "matched": len(tasks),
        "tasks": [t.task_id for t in tasks[:limit]],
        "more": len(tasks) > limit,
        "dryRun": dry_run,
        **outcomes,
        "skipped": [],
    }


async def _each(
    tasks: list[Task], act: Callable[[Task], Awaitable[None]], answer: dict[str, Any]
) -> None:
    """``act`` on each task, :data:`AT_ONCE` at a time; the answer's lists in task order."""
    for start in range(0, len(tasks), AT_ONCE):
        await asyncio.gather(*(act(t) for t in tasks[start : start + AT_ONCE]))
    order = {t.task_id: i for i, t in enumerate(tasks)}
    for key, value in answer.items():
        if key != "tasks" and isinstance(value, list):
            value.sort(key=lambda v: order[v if isinstance(v, str) else v["taskId"]])
