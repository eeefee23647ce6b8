"""The slow safety sweep: back-off expiry and in-flight deadlines.

A task past its deadline is not blindly re-sent: the platform is asked first
(RunningHub ``/outputs``), so a task that finished while its webhook was lost is
settled, never paid for twice. Only then is it cancelled remotely and retried. A paid
platform that does not answer is asked again on the next sweep; our own GPUs behind a
message-dispatcher that does not answer are given up on at once (a retry costs nothing).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aigcq.background import round_failed
from aigcq.domain import TaskState
from aigcq.jsonlog import ctx
from aigcq.platforms.base import Pending, Unknown
from aigcq.platforms.client import PlatformUnavailable
from aigcq.runtime import Runtime
from aigcq.scheduler.held import hold, holds
from aigcq.scheduler.outcomes import Outcomes

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(self, rt: Runtime, outcomes: Outcomes) -> None:
        self.rt = rt
        self.outcomes = outcomes

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.rt.settings.sweep_interval_s)
            try:
                await self.sweep_once()
            except Exception as exc:
                round_failed(log, "sweep failed", exc)

    async def sweep_once(self) -> None:
        await self.rt.store.promote_delayed()
        expired = await self.rt.store.expired()
        if expired:
            await asyncio.gather(*(self._expire(task_id) for task_id in expired))

    async def _expire(self, task_id: str) -> None:
        rt = self.rt
        task = await rt.store.get(task_id)
        if task is None or task.state.terminal:
            await rt.redis.zrem(rt.store.keys.inflight, task_id)
            return
        if task.deadline > time.time():
            return  # another process got here first and moved it on
        adapter = rt.platforms.adapters.get(task.target)
        account = rt.config.account(task.aigc, task.platform)
        apikey = account.apikey if account else ""
        still_running = False
        if adapter is not None and task.state is TaskState.RUNNING and task.remote_id:
            try:
                outcome = await rt.platforms.query(adapter, task, apikey)
            except PlatformUnavailable:
                if adapter.paid:
                    return  # unreachable: ask again on the next sweep, never pay twice
                # Our own GPUs behind a dispatcher that is gone: running the task again
                # costs nothing, waiting for the dispatcher could take forever.
                log.warning(
                    "task %s: %s unreachable after the deadline; retrying elsewhere",
                    task_id,
                    task.target,
                    extra=ctx(task=task_id),
                )
            else:
                if await self.outcomes.settle(task_id, outcome, note="queried after deadline"):
                    return
                if isinstance(outcome, Unknown) and adapter.paid:
                    return  # no readable answer: ask again on the next sweep, never pay twice
                still_running = isinstance(outcome, Pending)
        if still_running and adapter is not None and holds(adapter, task):
            await hold(rt, adapter, task, "deadline passed")
        await self.outcomes.retry_or_fail(
            task_id,
            aigc=task.aigc,
            platform=task.platform,
            attempt=task.attempt,
            reason=f"deadline passed on {task.target or 'dispatch'} ({task.state})",
        )
        if still_running and adapter is not None:
            # Only now: the platform reports a cancelled task as failed, and that report
            # must find the attempt already given up (see gateway/callbacks.py).
            await rt.platforms.cancel(adapter, task, apikey)
