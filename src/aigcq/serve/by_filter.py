"""Cancel and replay tasks by filter: ``POST /api/admin/tasks/cancel`` and
``POST /api/admin/tasks/replay`` (``aigcq tasks cancel`` / ``aigcq tasks retry --failed``
with filters).

A filter names states, a project (AIGC), a platform, a client (backendId), a target and a
time: the task's last change at or after it (when it started waiting or running, or when
it ended). An empty field admits any task, but a filter names at least one field: a
control never acts on every task unasked. Tasks are found as the operator's list finds
them (:mod:`aigcq.queue.listing`), then acted on through the lifecycle as one task's
cancel or retry is: a cancel stops its run (a paid remote task is cancelled there), a
replay never pays a platform twice (:meth:`Lifecycle.retried_by_operator`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import fields
from typing import Any

from aigcq.domain import LIVE_STATES, Task, TaskState
from aigcq.queue.listing import TaskFilter, find_tasks
from aigcq.queue.store import Retried
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle

AT_ONCE = 50  # tasks acted on concurrently
#: the states a cancel and a replay (:data:`~aigcq.queue.listing.REPLAYABLE`) act on
CANCELLABLE = frozenset(LIVE_STATES)


class FilterError(ValueError):
    """A filter that names an unknown state, project, platform or target, or nothing."""


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


async def cancel_matching(
    lifecycle: Lifecycle, wanted: TaskFilter, *, limit: int, dry_run: bool
) -> dict[str, Any]:
    """Cancel the first ``limit`` live tasks ``wanted`` admits (as an operator)."""
    tasks = await find_tasks(lifecycle.rt.store, wanted)
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
    tasks = await find_tasks(lifecycle.rt.store, wanted)
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
