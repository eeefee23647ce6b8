"""What a paid platform's answers bring about, beside the task's life in
:mod:`aigcq.scheduler.lifecycle`: a create about to be sent (its intent recorded first),
one the platform did not make or never got, a rejection, a task priced out or over its
budget before anything was sent; a create whose process died while it may have been out,
and a platform that gave no usable answer (the sweeper); an unwanted remote task that
ended or still runs (the orphan checks). Each moves the task through the store as the
lifecycle's own methods do, and announces and fails through the lifecycle.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from aigcq.domain import ErrorCode, Task
from aigcq.observability.jsonlog import say_task
from aigcq.platforms.base import Failed, Succeeded
from aigcq.queue.store import Begun, Claimed, NotReplicated, Orphan
from aigcq.scheduler.lifecycle import Lifecycle, said_late
from aigcq.scheduler.spend import due_cost

log = logging.getLogger(__name__)


_say = functools.partial(say_task, log)  # one line about a task


class PaidRuns:
    """The moves a paid platform's answers (and their absence) make; see the module."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.rt = lifecycle.rt

    async def creating(self, c: Claimed, create_id: str, *, gate: str = "") -> Begun:
        """A paid create is about to be sent (from here on it may be out), within the
        budgets of ``gate`` (:mod:`aigcq.scheduler.budgets`); False: send nothing (the task
        moved on, a budget is reached, or its intent is not on the replicas: a failover now
        would lose the record and pay it again; it waits and is tried again)."""
        begun = await self.rt.store.begin_create(
            c.task_id, c.attempt, create_id, deadline_s=self.rt.dispatch_deadline_s, gate=gate
        )
        if begun:
            try:
                await self.lifecycle.made_durable(c.task_id, "its create intent")
            except NotReplicated:
                return Begun(recorded=False)
        return begun

    async def never_created(self, c: Claimed, create_id: str) -> None:
        """A paid platform answered a create with a definite "not created" (full, refused,
        never sent) after the task had moved on (a cancel): the create kept its account's
        slot as an orphan, free now, not at the deadline. (While the task is live there is
        no such orphan: the answer's own move is enough.)"""
        if await self.rt.store.release_create(create_id):
            _say(logging.INFO, c.task_id, "its create %s was not made; its slot is free", create_id)

    async def not_sent(self, c: Claimed, queue: tuple[str, str], reason: str) -> bool:
        """A paid platform was full or never got the create: back to waiting after a
        back-off, uncharged while the task has free requeues left; then it uses attempts.
        False: the task had moved on."""
        if c.uncharged >= self.rt.store.free_requeues:
            return await self.lifecycle.refused(c, queue, reason)
        delay_s = self.rt.settings.full_backoff_s
        return await self.lifecycle.not_run(c.task_id, c.attempt, reason, delay_s=delay_s)

    async def rejected(self, c: Claimed, target: str, error: dict[str, Any]) -> bool:
        """A paid platform rejected the task for good: it fails. False: it had moved on."""
        done = await self.lifecycle.fail(
            c.task_id,
            c.attempt,
            ErrorCode.TASK_FAILED,
            error,
            f"{target} rejected: {error['code']}",
            ended=True,
        )
        _say(logging.WARNING, c.task_id, "rejected by %s: %s", target, error)
        return done.applied

    async def priced_out(self, c: Claimed, reason: str) -> bool:
        """The task's expected cost on the paid platform that would run it is above its
        ``maxCost``, and nothing else runs its platform: it fails, nothing sent. False: it
        had moved on."""
        return await self._not_sent_for_good(c, ErrorCode.MAX_COST, reason)

    async def over_budget(self, c: Claimed, reason: str) -> bool:
        """A budget of the task's project or account is reached and its project fails its
        tasks then: it fails ``BudgetExceeded``, nothing sent. False: it had moved on."""
        return await self._not_sent_for_good(c, ErrorCode.BUDGET, reason)

    async def _not_sent_for_good(self, c: Claimed, code: ErrorCode, reason: str) -> bool:
        error = {"code": code.value, "message": reason, "detail": None}
        done = await self.lifecycle.fail(c.task_id, c.attempt, code, error, reason, ended=True)
        if done.applied:
            _say(logging.WARNING, c.task_id, "not sent: %s", reason)
        return done.applied

    async def awaiting_webhook(self, task: Task, left_s: float, kind: str) -> bool:
        """Its process died while a create may have been out: the task waits as running
        for the create's webhook, until the task's own deadline from the create."""
        moved = await self.rt.store.mark_running(
            task.task_id, task.attempt, "", deadline_s=max(left_s, 1.0), kind=kind
        )
        if moved:
            _say(
                logging.WARNING,
                task.task_id,
                "its create on %s may be out; waiting for its webhook",
                task.target,
            )
        return bool(moved)

    async def no_answer(self, task: Task, reason: str, *, max_delay_s: float) -> float:
        """Its platform gave no usable answer about the task: asked again later, with
        back-off; the delay."""
        delay = await self.rt.store.postpone(task.task_id, task.attempt, max_delay_s=max_delay_s)
        _say(
            logging.WARNING,
            task.task_id,
            "%s gave no usable answer (%s); asking again in %.1f s",
            task.target,
            reason,
            delay,
        )
        return delay

    # ---- unwanted remote tasks (the orphan checks) ----------------------------------------

    async def orphan_ended(
        self, o: Orphan, result: Any = None, outcome: Succeeded | Failed | None = None
    ) -> bool:
        """The platform says an unwanted remote task ended (or it cannot be asked): it
        leaves its account's cap. ``result``: the success it reported, kept for a replay
        if its task ended failed or cancelled meanwhile, or delivered at once when that
        failure was ``UncertainSubmit`` and this is the run it gave up on (a late success).
        ``outcome``: what the platform answered, the run billed: charged."""
        cost = due_cost(outcome) if outcome is not None else b""
        released = await self.rt.store.release_orphan(o.remote_id, result, cost)
        if released.moved is not None:
            said_late(o.task_id, o.target, o.attempt)
        if released.released and cost:
            await self.lifecycle.spend.charge_due(o.task_id)
        return released.released

    async def orphan_unresolved(self, o: Orphan, delay_s: float) -> None:
        """An unwanted remote task still runs (or gave no answer): checked again later."""
        await self.rt.store.check_orphan_later(o, delay_s)
