"""The slow safety sweep: back-off expiry, in-flight deadlines, and unwanted remote tasks.

A task past its deadline is not blindly re-sent. On a paid platform:

* still ``dispatching`` with no create recorded: it was never sent (its process died
  first): back to waiting, no attempt used;
* ``dispatching`` with a create recorded (its process died while it was out): it may have
  been created, so it waits as running (keeping its cap slot) for its webhook until the
  task's own deadline;
* running with no remote id (the create's outcome stayed unknown, no webhook came): the
  platform cannot be asked without one, so the task fails with ``UncertainSubmit``, unless
  the account opts into ``retry_uncertain`` (then the unresolved create stays counted in
  the cap as ``create:<createId>`` while the task is sent again);
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
from aigcq.scheduler.orphans import orphan_of
from aigcq.scheduler.outcomes import Outcomes
from aigcq.service.runtime import Runtime

log = logging.getLogger(__name__)

#: expired tasks looked at concurrently (each holds a Redis connection for a while)
BATCH = 50
#: longest wait between two questions about a task its platform could not answer
MAX_UNKNOWN_BACKOFF_S = 60.0


class Sweeper:
    def __init__(self, rt: Runtime, outcomes: Outcomes) -> None:
        self.rt = rt
        self.outcomes = outcomes

    async def run(self) -> None:
        await every(self.rt.settings.sweep_interval_s, self.sweep_once, log, "sweep failed")

    async def sweep_once(self) -> None:
        await self.rt.store.promote_delayed()
        expired = await self.rt.store.expired()
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
        await self.outcomes.orphans.check_due()

    async def _expire(self, task_id: str) -> None:
        rt = self.rt
        task = await rt.store.get(task_id)
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

    async def _retry(self, task: Task, *, ended: bool = False) -> bool:
        return await self.outcomes.retry_or_fail(
            task.task_id,
            aigc=task.aigc,
            platform=task.platform,
            attempt=task.attempt,
            charged=task.charged,
            reason=f"deadline passed on {task.target or 'dispatch'} ({task.state})",
            ended=ended,
        )

    def _apikey(self, task: Task) -> str:
        account = self.rt.config.account(task.aigc, task.platform)
        return account.apikey if account else ""

    async def _free_target(self, task: Task, adapter: PlatformAdapter | None) -> None:
        """Our own GPUs: ask a message-dispatcher first, else run the task again."""
        outcome = None
        if adapter is not None and task.state is TaskState.RUNNING and task.remote_id:
            outcome = await self.rt.platforms.query(adapter, task, self._apikey(task))
            if await self.outcomes.settle(task.task_id, outcome, "queried after deadline"):
                return
            if isinstance(outcome, Unknown):
                log.warning(
                    "task %s: %s unreachable after the deadline; retrying elsewhere",
                    task.task_id,
                    task.target,
                    extra=ctx(task=task.task_id),
                )
        moved = await self._retry(task)
        if moved and adapter is not None and isinstance(outcome, Pending):
            await self.rt.platforms.cancel(adapter, task, self._apikey(task))

    async def _dispatching(self, task: Task, adapter: PlatformAdapter) -> None:
        rt = self.rt
        if not task.create_id:
            if await rt.store.requeue_unsent(
                task.task_id, task.attempt, "never sent to the platform (its process stopped)"
            ):
                log.warning(
                    "task %s: was never sent to %s; back to waiting",
                    task.task_id,
                    task.target,
                    extra=ctx(task=task.task_id),
                )
            return
        # A create may be out: wait for its webhook (its URL still names this attempt).
        account = rt.config.account(task.aigc, task.platform)
        left = task.create_at + rt.deadline_s(account) - time.time()
        if await rt.store.mark_running(
            task.task_id, task.attempt, "", deadline_s=max(left, 1.0), kind=adapter.kind
        ):
            log.warning(
                "task %s: its create on %s may be out; waiting for its webhook",
                task.task_id,
                task.target,
                extra=ctx(task=task.task_id),
            )

    async def _uncertain(self, task: Task) -> None:
        """Running with no remote id at the deadline: the create's outcome is unknown."""
        account = self.rt.config.account(task.aigc, task.platform)
        if account is not None and account.retry_uncertain:
            await self._retry(task)
            return
        reason = f"the create on {task.target} may or may not have been accepted"
        error = {"code": ErrorCode.UNCERTAIN_SUBMIT.value, "message": reason, "detail": None}
        done = await self.outcomes.fail(
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
        outcome = await rt.platforms.query(adapter, task, self._apikey(task))
        match outcome:
            case Succeeded() | Failed():
                await self.outcomes.settle(
                    task.task_id, outcome, "queried after deadline", attempt=task.attempt
                )
            case NotFound():
                await self._retry(task, ended=True)
            case Unknown(reason=reason):
                delay = await rt.store.postpone(
                    task.task_id, task.attempt, max_delay_s=MAX_UNKNOWN_BACKOFF_S
                )
                log.warning(
                    "task %s: %s gave no usable answer (%s); asking again in %.1f s",
                    task.task_id,
                    task.target,
                    reason,
                    delay,
                    extra=ctx(task=task.task_id),
                )
            case _:  # still running past its deadline: retry, and cancel this run
                if await self._retry(task):
                    await self.outcomes.orphans.cancel(orphan_of(task, task.remote_id))
