"""Keeps a running attempt's semaphore lease alive until the attempt ends."""

from __future__ import annotations

import asyncio
import logging

from aigcq.asynch.semaphore import Semaphore
from aigcq.asynch.tasks_repo import ClaimedTask
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import round_failed
from aigcq.plumbing.cancel import cancel_and_wait

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews the lease every third of its length until :meth:`stop`.

    A timer, not a task per attempt: most attempts end before the first renewal is due,
    and then keeping their lease costs one timer instead of a task to start and cancel.
    """

    def __init__(self, semaphore: Semaphore, task: ClaimedTask) -> None:
        self.semaphore = semaphore
        self.task = task
        self._period = semaphore.lease_seconds / 3
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(self._period, self._due)
        self._renewing: asyncio.Task[None] | None = None

    def _due(self) -> None:
        self._renewing = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        task = self.task
        try:
            if not await self.semaphore.renew(task.model_name, task.tenant_id, task.lease_id):
                log.warning(
                    "task %s: semaphore lease was lost; put back",
                    task.task_id,
                    extra=ctx(task=task.task_id),
                )
        except Exception as exc:  # not known to be lost: the next renewal tries again
            round_failed(log, f"task {task.task_id}: renewing the semaphore lease", exc)
        if self._timer is not None:  # not stopped meanwhile
            self._timer = self._loop.call_later(self._period, self._due)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._renewing is not None and not self._renewing.done():
            await cancel_and_wait([self._renewing])
