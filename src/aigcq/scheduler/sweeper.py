"""The slow safety sweep: back-off expiry, charges left due, start deadlines and
in-flight deadlines (unwanted remote tasks are watched by :mod:`.orphan_checks`, in a
loop of their own).

A billed run's charge is made due by the end that bills it, in the same step, and made by
that process right after; one due for longer than
:data:`aigcq.scheduler.spend.DUE_GRACE_S` (its process died between) is made here, once.

A waiting task that never ran, past its start deadline (``maxWaitMs``, no
``keepWaiting``), ends ``TaskExpired`` wherever it is in its queue (a dispatch round
expires those it reads too).

A task past its deadline is not blindly re-sent. On a paid platform:

* still ``dispatching`` with no create recorded: it was never sent (its process died
  first): back to waiting, no attempt used;
* ``dispatching`` with a create recorded (its process died while it was out): it may have
  been created, so it waits as running (keeping its cap slot) for its webhook until the
  task's own deadline;
* running with no remote id (the create's outcome stayed unknown, no webhook came): the
  platform cannot be asked without one, so the task fails with ``UncertainSubmit``, unless
  the account opts into ``retry_uncertain`` (then the unresolved create stays counted in
  the cap as ``create:<createId>`` while the task is sent again, until its webhook or the
  platform's maximum run time: :mod:`.orphan_checks`). A result that still comes for that
  create (its webhook, or a poll once its remote id is known) wins over the failure: the
  task becomes a success and its client is told (``release_orphan.lua``'s
  ``late_success``). A create the platform accepted is
  never in this case for want of Redis: its acceptance is held and journaled
  (:mod:`.journal`);
* running with a remote id: the platform is asked (RunningHub ``/outputs``). A result
  settles it; "not found" frees a retry; "still running" retries and cancels the old run
  (it stays counted until it ends); no usable answer asks again later, with back-off.

Our own GPUs (bridges, or behind a message-dispatcher) are retried as before: a second
run costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aigcq.domain import ErrorCode, Task, TaskState
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import (
    Failed,
    NotFound,
    Pending,
    PlatformAdapter,
    Succeeded,
    Unknown,
)
from aigcq.plumbing.background import every
from aigcq.runtime import Runtime
from aigcq.scheduler.deadlines import TaskDeadlines
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.orphans import orphan_of
from aigcq.scheduler.paid_runs import PaidRuns

log = logging.getLogger(__name__)

#: expired tasks looked at concurrently (each holds a Redis connection for a while)
BATCH = 50
#: longest wait between two questions about a task its platform could not answer
MAX_UNKNOWN_BACKOFF_S = 60.0


class Sweeper:
    def __init__(self, rt: Runtime, lifecycle: Lifecycle) -> None:
        self.rt = rt
        self.lifecycle = lifecycle
        self.paid_runs = PaidRuns(lifecycle)
        self.deadlines = TaskDeadlines(lifecycle)

    async def run(self) -> None:
        await every(self.rt.settings.sweep_interval_s, self.sweep_once, log, "sweep failed")

    async def sweep_once(self) -> None:
        await self.deadlines.back_offs_over()
        await self.lifecycle.spend.charge_overdue()
        missed = await self.rt.store.reads.past_start_by()
        for start in range(0, len(missed), BATCH):  # a batch: one pipelined write
            await asyncio.gather(
                *(self.deadlines.start_missed(t) for t in missed[start : start + BATCH])
            )
        expired = await self.rt.store.reads.expired()
        for start in range(0, len(expired), BATCH):
            batch = expired[start : start + BATCH]
            done = await asyncio.gather(*(self._expire(t) for t in batch), return_exceptions=True)
            for task_id, problem in zip(batch, done, strict=True):
                if isinstance(problem, Exception):  # the others still go on
                    log.warning(
                        "task %s: deadline check failed: %r",
                        task_id,
                        problem,
                        exc_info=problem,
                        extra=ctx(task=task_id),
                    )

    async def _expire(self, task_id: str) -> None:
        rt = self.rt
        task = await rt.store.reads.get(task_id)
        if task is None or task.state.terminal:
            await rt.redis.zrem(rt.store.keys.inflight, task_id)
            return
        if task.deadline > time.time():
            return  # another process got here first and moved it on
        adapter = rt.platforms.adapters.get(task.target)
        if adapter is None or not adapter.paid:
            await self._free_target(task, adapter)
        elif task.state is TaskState.DISPATCHING:
            await self._dispatching(task, adapter)
        elif not task.remote_id:
            await self._uncertain(task)
        else:
            await self._ask(task, adapter)

    async def _free_target(self, task: Task, adapter: PlatformAdapter | None) -> None:
        """Our own GPUs: ask a message-dispatcher first, else run the task again."""
        outcome = None
        if adapter is not None and task.state is TaskState.RUNNING and task.remote_id:
            apikey = self.rt.apikey(task.aigc, task.platform)
            outcome = await self.rt.platforms.query(adapter, task, apikey)
            note = "queried after deadline"
            if await self.lifecycle.settle(task.task_id, outcome, note, target=task.target):
                return
            if isinstance(outcome, Unknown):
                log.warning(
                    "task %s: %s unreachable after the deadline; retrying elsewhere",
                    task.task_id,
                    task.target,
                    extra=ctx(task=task.task_id),
                )
        moved = await self.deadlines.timed_out(task)
        if moved and adapter is not None and isinstance(outcome, Pending):
            await self.rt.platforms.cancel(adapter, task, self.rt.apikey(task.aigc, task.platform))

    async def _dispatching(self, task: Task, adapter: PlatformAdapter) -> None:
        if not task.create_id:
            reason = f"never sent to {task.target} (its process stopped)"
            await self.lifecycle.unsent(task.task_id, task.attempt, reason)
            return
        # A create may be out: wait for its webhook (its URL still names this attempt).
        account = self.rt.config.account(task.aigc, task.platform)
        left = task.create_at + self.rt.deadline_s(account) - time.time()
        await self.paid_runs.awaiting_webhook(task, left, adapter.kind)

    async def _uncertain(self, task: Task) -> None:
        """Running with no remote id at the deadline: the create's outcome is unknown."""
        account = self.rt.config.account(task.aigc, task.platform)
        if account is not None and account.retry_uncertain:
            await self.deadlines.timed_out(task)
            return
        reason = f"the create on {task.target} may or may not have been accepted"
        error = {"code": ErrorCode.UNCERTAIN_SUBMIT.value, "message": reason, "detail": None}
        done = await self.lifecycle.fail(
            task.task_id, task.attempt, ErrorCode.UNCERTAIN_SUBMIT, error, reason
        )
        if done.applied:
            log.error(
                "task %s: %s; not sent again",
                task.task_id,
                reason,
                extra=ctx(task=task.task_id),
            )

    async def _ask(self, task: Task, adapter: PlatformAdapter) -> None:
        """A paid task with a remote id at its deadline: the platform decides."""
        rt = self.rt
        outcome = await rt.platforms.query(adapter, task, self.rt.apikey(task.aigc, task.platform))
        match outcome:
            case Succeeded() | Failed():
                await self.lifecycle.settle(
                    task.task_id,
                    outcome,
                    "queried after deadline",
                    attempt=task.attempt,
                    target=task.target,
                )
            case NotFound():
                await self.deadlines.timed_out(task, ended=True)
            case Unknown(reason=reason):
                await self.paid_runs.no_answer(task, reason, max_delay_s=MAX_UNKNOWN_BACKOFF_S)
            case _:  # still running past its deadline: retry, and cancel this run
                if await self.deadlines.timed_out(task):
                    await self.lifecycle.orphans.cancel(orphan_of(task, task.remote_id))
