"""The scheduler's view of Redis (docs/scheduling.md): what a dispatch round reads
(:meth:`aigcq.queue.reads.TaskReads.window`) as the inputs of
:func:`aigcq.scheduler.policy.plan_round`.

* each waiting task of the window as a :class:`~aigcq.scheduler.policy.Waiting`: its
  expected GPU-seconds the recent mean run time of its workflow (before that workflow's
  first run, the mean of the others'; before any run, ``AIGCQ_SHARE_DEFAULT_RUN_S``);
* the pool: this process's free slots, the slots free in other processes, and the
  expected time left of every task in flight on the internal target
  (:func:`~aigcq.scheduler.policy.time_left`, from when it started running);
* the shares: ``AIGCQ_SHARE_WEIGHTS`` and the usage records decayed to now
  (charged as runs start and end on our GPUs, ``_prelude.lua``).

With ``AIGCQ_USER_MAX_RUNNING``, an end user's tasks beyond what the limit leaves it (its
tasks on our GPUs counted in Redis) are not planned this round: they wait, by rank, for
its running ones to end (the claim script enforces the limit too, across processes). A
project's ``share`` in model.json does the same with its ``max`` GPUs, and its ``min``
puts it first while fewer than that run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aigcq.config import ProjectShare, Settings
from aigcq.queue.keys import Keys
from aigcq.queue.store import Window
from aigcq.scheduler.policy import Pool, Shares, Tuning, Waiting, decayed, time_left


@dataclass(frozen=True, slots=True)
class Inputs:
    """What :func:`~aigcq.scheduler.policy.plan_round` is given, but the paid room."""

    tasks: list[Waiting]
    pool: Pool
    shares: Shares


def tuning(settings: Settings) -> Tuning:
    """The round's knobs, from the ``AIGCQ_SHARE_*`` settings."""
    return Tuning(
        lend_s=settings.share_lend_s,
        patience=settings.share_patience,
        margin=settings.share_margin,
        overflow_after_s=settings.overflow_after_ms / 1000,
        shares=settings.shares,
    )


def held_beyond(
    tasks: list[Waiting],
    running: Mapping[Any, int],
    limits: Mapping[Any, int],
    tenant: Callable[[Waiting], Any],
) -> list[Waiting]:
    """``tasks``, those beyond what their tenant's limit (``limits``, by ``tenant(task)``;
    a tenant not listed has none) leaves it after its ``running`` ones marked ``held``, by
    rank (list order on ties): our GPUs may not take them now. A held task with no start
    deadline is left out (it only waits); one with a deadline stays for its paid platform
    (:func:`~aigcq.scheduler.policy.plan_round` rescues it there)."""
    if not limits:
        return tasks
    left = {who: cap - running.get(who, 0) for who, cap in limits.items()}
    out: dict[int, Waiting] = {}
    for position, task in sorted(enumerate(tasks), key=lambda pt: (pt[1].rank, pt[0])):
        who = tenant(task)
        if who not in left or left[who] > 0:
            out[position] = task
            if who in left:
                left[who] -= 1
        elif task.start_by is not None:
            out[position] = replace(task, held=True)
    return [out[p] for p in sorted(out)]


def any_run(runs: Mapping[str, float], default_s: float) -> float:
    """The expected run time (s) of a workflow our GPUs never ran: the mean of the
    workflows' recent means, else ``default_s``."""
    return statistics.fmean(runs.values()) if runs else default_s


def run_times(runs: Mapping[str, float], default_s: float) -> Callable[[str], float]:
    """A workflow's expected run time on our GPUs (s): its recent mean, else
    :func:`any_run`."""
    unknown = any_run(runs, default_s)
    return lambda workflow: runs.get(workflow, unknown)


def inputs(
    window: Window,
    *,
    free: int,
    free_elsewhere: int,
    settings: Settings,
    keys: Keys,
    now: float,
    projects: Mapping[str, ProjectShare] | None = None,
    booting_s: Sequence[float] = (),
) -> Inputs:
    """The planner's inputs of ``window``; ``projects``: the projects' shares of our GPUs
    (model.json ``share``: a minimum, a ceiling, a weight); ``booting_s``: the seconds
    until each instance that is booting registers (slots that free then)."""
    projects = projects or {}
    run_s = run_times(window.runs, settings.share_default_run_s)
    tasks = [
        Waiting(
            t.task_id,
            (t.aigc, t.platform),
            t.created,
            run_s(t.workflow_id),
            user=t.user,
            start_by=t.start_by,
            keep_waiting=t.keep_waiting,
            credit_s=t.credit_s,
        )
        for t in window.tasks
    ]
    limit = settings.user_max_running
    users_read = {(t.queue[0], t.user) for t in tasks if t.user}
    user_limits = dict.fromkeys(users_read, limit) if limit > 0 else {}
    tasks = held_beyond(tasks, window.users, user_limits, lambda t: (t.queue[0], t.user))
    ceilings = {p: share.max for p, share in projects.items() if share.max is not None}
    tasks = held_beyond(tasks, window.running, ceilings, lambda t: t.queue[0])
    busy = [time_left(run_s(w), now - started if started else 0.0) for w, started in window.busy]
    busy += booting_s
    named = {t.queue[0] for t in tasks}
    users = {(t.queue[0], t.user) for t in tasks if t.user}
    half_life_s = settings.share_half_life_s

    def recent(key: str) -> float:
        value, at = window.usage.get(key, (0.0, now))
        return decayed(value, now - at, half_life_s)

    weights = {p: share.weight for p, share in projects.items() if share.weight is not None}
    shares = Shares(
        weights={**settings.share_weights, **weights},
        usage={p: recent(keys.usage(p)) for p in named},
        user_usage={(p, u): recent(keys.usage(p, u)) for p, u in users},
        owed={p: share.min - window.running.get(p, 0) for p, share in projects.items()},
    )
    return Inputs(tasks, Pool(free, free_elsewhere, busy), shares)
