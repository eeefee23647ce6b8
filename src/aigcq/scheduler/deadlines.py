"""A task's deadlines, as the sweeper and the dispatch rounds see them pass: a back-off
over, a start deadline (``maxWaitMs``) passed before the task started, a wait longer than
a queue allows, an attempt past its run deadline. Each moves the task through the store
and announces through the lifecycle, as :mod:`aigcq.scheduler.lifecycle`'s own methods do.
"""

from __future__ import annotations

import functools
import logging

from aigcq.domain import ErrorCode, Task, TaskState
from aigcq.observability import metrics
from aigcq.observability.jsonlog import say_task
from aigcq.scheduler.ends import TaskEnd
from aigcq.scheduler.lifecycle import Lifecycle

log = logging.getLogger(__name__)


_say = functools.partial(say_task, log)  # one line about a task


class TaskDeadlines:
    """What a passed deadline does to a task (see the module)."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.rt = lifecycle.rt

    async def back_offs_over(self) -> int:
        """Tasks whose back-off is over wait in their queues again."""
        return await self.rt.store.promote_delayed()

    async def expired(self, task: Task, code: str, message: str, note: str) -> bool:
        """A task waited longer than it may: it fails (``TaskTimeout`` for its client)."""
        error = {"code": code, "message": message, "detail": None}
        done = await self.rt.store.finish(
            task.task_id,
            TaskState.FAILED,
            error=error,
            message=self.lifecycle.error_body(ErrorCode.TASK_TIMEOUT, error),
            note=note,
        )
        if done.applied:
            _say(logging.WARNING, task.task_id, "%s", message)
            if task.attempt and task.state is not TaskState.PENDING:
                self.lifecycle.traces.attempt_over(
                    task.task_id, task.attempt, "expired", error=message
                )
        return done.applied

    async def start_missed(self, task_id: str) -> bool:
        """A waiting task that never ran is past its start deadline (``maxWaitMs``, and
        no ``keepWaiting``): it fails ``TaskExpired`` for its client, nothing paid. False:
        it was not waiting, or it ran once (it has no start deadline any more)."""
        message = "its start deadline (maxWaitMs) passed before it started"
        error = {"code": ErrorCode.TASK_EXPIRED.value, "message": message, "detail": None}
        done = await self.rt.store.expire(
            task_id,
            error=error,
            message=self.lifecycle.error_body(ErrorCode.TASK_EXPIRED, error),
            note="start deadline passed",
        )
        if done.applied:
            metrics.start_expired(done.aigc, done.platform)
            _say(logging.INFO, task_id, "expired: %s; nothing paid", message)
        return done.applied

    async def timed_out(self, task: Task, *, ended: bool = False) -> bool:
        """The live attempt is past its deadline: another attempt, or the task fails
        (:meth:`Lifecycle.retry_or_fail`; ``ended``: its remote task is known to be over); the
        attempt is stopped on its target (a bridge interrupts its prompt, and frees the
        instance when it says so; a paid one's remote task is an orphan). True when the
        task moved."""
        moved = await self.lifecycle.retry_or_fail(
            task.task_id,
            aigc=task.aigc,
            platform=task.platform,
            attempt=task.attempt,
            charged=task.charged,
            reason=f"deadline passed on {task.target or 'dispatch'} ({task.state})",
            ended=ended,
        )
        if moved:
            self.lifecycle.announce(task.task_id, task.target, TaskEnd.TIMED_OUT, task.attempt)
        return moved
