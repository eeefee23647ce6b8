"""Turning what a target said into task transitions and client messages.

Used by the callback endpoint, the poller and the deadline sweeper alike, so a result
reaches the client the same way whichever path noticed it first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aigcq.domain import ErrorCode, TaskState
from aigcq.jsonlog import ctx
from aigcq.platforms.base import Failed, NotFound, Pending, ResultOutcome, Succeeded, Unknown
from aigcq.queue.store import Finished
from aigcq.runtime import Runtime

log = logging.getLogger(__name__)


class Outcomes:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: called with (taskId, target, succeeded) once a TASK_END callback finished a task
        self.on_task_end: Callable[[str, str, bool], None] = lambda task_id, target, ok: None
        #: a failed result puts the task back while it has attempts left (the
        #: message-dispatcher's retries, seed 000 §9.3.2); otherwise it fails at once
        self.retry_failures = False

    def error_body(self, code: ErrorCode, detail: Any = None) -> dict[str, Any]:
        return {"code": code.value, "msg": self.rt.config.messages.get(code.value), "error": detail}

    async def settle(self, task_id: str, outcome: ResultOutcome, note: str) -> Finished | None:
        """Apply a finished result; ``None`` when the outcome says the task is not done."""
        match outcome:
            case Succeeded(data=data):
                done = await self.rt.store.finish(
                    task_id, TaskState.SUCCESS, result=data, message={"data": data}, note=note
                )
            case Failed(code=code, message=message, detail=detail):
                error = {"code": code, "message": message, "detail": detail}
                if await self._retried(task_id, f"failed: {code} {message}"):
                    return Finished(True, TaskState.PENDING)
                done = await self.rt.store.finish(
                    task_id,
                    TaskState.FAILED,
                    error=error,
                    message=self.error_body(ErrorCode.TASK_FAILED, error),
                    note=note,
                )
            case Pending() | NotFound():
                return None
            case Unknown(reason=reason):
                log.warning(
                    "task %s: unreadable answer via %s: %s",
                    task_id,
                    note,
                    reason,
                    extra=ctx(task=task_id),
                )
                return None
        log.debug(
            "task %s: %s via %s (applied=%s)",
            task_id,
            done.state,
            note,
            done.applied,
            extra=ctx(task=task_id),
        )
        return done

    async def _retried(self, task_id: str, reason: str) -> bool:
        """With ``retry_failures``: requeue a failed task that has attempts left."""
        if not self.retry_failures:
            return False
        task = await self.rt.store.get(task_id)
        if task is None or task.state.terminal:
            return False
        if task.attempt >= self.rt.max_attempts(self.rt.config.account(task.aigc, task.platform)):
            return False
        retried = await self.rt.store.requeue(task_id, attempt=task.attempt, reason=reason)
        if retried:
            log.warning(
                "task %s: attempt %s %s, retrying",
                task_id,
                task.attempt,
                reason,
                extra=ctx(task=task_id),
            )
        return retried

    async def retry_or_fail(
        self,
        task_id: str,
        *,
        aigc: str,
        platform: str,
        attempt: int,
        reason: str,
        code: ErrorCode = ErrorCode.TASK_TIMEOUT,
        detail: Any = None,
    ) -> None:
        """Requeue at the head for another attempt, or fail once attempts are used up."""
        account = self.rt.config.account(aigc, platform)
        if attempt < self.rt.max_attempts(account):
            if await self.rt.store.requeue(
                task_id, attempt=attempt, delay_s=min(attempt, 10), reason=reason
            ):
                log.warning(
                    "task %s: attempt %s %s, retrying",
                    task_id,
                    attempt,
                    reason,
                    extra=ctx(task=task_id),
                )
            return
        error = {"code": code.value, "message": reason, "detail": detail}
        await self.rt.store.finish(
            task_id,
            TaskState.FAILED,
            error=error,
            message=self.error_body(code, error),
            note=reason,
        )
        log.error(
            "task %s: failed after %s attempts: %s",
            task_id,
            attempt,
            reason,
            extra=ctx(task=task_id),
        )
