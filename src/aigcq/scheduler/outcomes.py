"""Turning what a target said into task transitions and client messages.

Used by the callback endpoint, the poller and the deadline sweeper alike, so a result
reaches the client the same way whichever path noticed it first. Every report names the
attempt it came from: a failure of an attempt that is no longer the live one changes
nothing (checked inside the finishing script); a success of an older one still wins, and
the live attempt's remote task is then cancelled (:mod:`aigcq.scheduler.orphans`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

from aigcq.domain import ErrorCode, TaskState
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Failed, ResultOutcome, Succeeded
from aigcq.queue.store import Claimed, MoveResult
from aigcq.scheduler.orphans import Orphans
from aigcq.service.runtime import Runtime

log = logging.getLogger(__name__)

#: the ``class`` a bridge gives a failure that is the machine's, not the task's
INFRASTRUCTURE = "infrastructure"


class TaskEnd(enum.Enum):
    """How a task's run on a target ended, as its TASK_END (or a cancel) says."""

    SUCCEEDED = "succeeded"  # the target's failure count resets
    FAILED = "failed"  # the machine's failure (or cause unknown): counts against it
    REJECTED = "rejected"  # the task's own fault: the target's health is unchanged
    GONE = "gone"  # not applied: that attempt was superseded or the task is over
    CANCELLED = "cancelled"  # by its client or an admin: the target is told to stop


def end_of(outcome: ResultOutcome) -> TaskEnd:
    """The :class:`TaskEnd` of an applied TASK_END."""
    if isinstance(outcome, Succeeded):
        return TaskEnd.SUCCEEDED
    if isinstance(outcome, Failed) and _failure_class(outcome) == "task":
        return TaskEnd.REJECTED
    return TaskEnd.FAILED


def _failure_class(outcome: Failed) -> str:
    detail = outcome.detail
    return str(detail.get("class", "")) if isinstance(detail, dict) else ""


#: (taskId, target, how it ended, the attempt the TASK_END was for, if known)
TaskEndHook = Callable[[str, str, TaskEnd, "int | None"], None]


class Outcomes:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.orphans = Orphans(rt)
        #: called once a TASK_END callback finished a task, or was refused as gone, or a
        #: task was cancelled (see :class:`TaskEnd`)
        self.on_task_end: TaskEndHook = lambda task_id, target, end, attempt: None
        #: a failed result puts the task back while it has attempts left (the
        #: message-dispatcher's retries, seed 000 §9.3.2); otherwise it fails at once
        self.retry_failures = False

    def error_body(self, code: ErrorCode, detail: Any = None) -> dict[str, Any]:
        return {"code": code.value, "msg": self.rt.config.messages.get(code.value), "error": detail}

    async def settle(
        self, task_id: str, outcome: ResultOutcome, note: str, attempt: int | None = None
    ) -> MoveResult | None:
        """Apply a finished result reported by ``attempt`` (None: not known, e.g. a
        message-dispatcher's report); ``None`` when the outcome says the task is not done."""
        match outcome:
            case Succeeded(data=data):
                done = await self.rt.store.finish(
                    task_id,
                    TaskState.SUCCESS,
                    result=data,
                    message={"result": data},
                    note=note,
                    from_attempt=attempt,
                    ended=True,
                )
            case Failed(code=code, message=message, detail=detail):
                error = {"code": code, "message": message, "detail": detail}
                machine = _failure_class(outcome) == INFRASTRUCTURE
                if await self._retried(task_id, f"failed: {code} {message}", attempt, machine):
                    return MoveResult(True, TaskState.PENDING)
                done = await self.rt.store.finish(
                    task_id,
                    TaskState.FAILED,
                    error=error,
                    message=self.error_body(ErrorCode.TASK_FAILED, error),
                    note=note,
                    from_attempt=attempt,
                    fenced=attempt is not None,
                    ended=True,
                )
            case _:
                return None
        log.debug(
            "task %s: %s via %s (applied=%s)",
            task_id,
            done.state,
            note,
            done.applied,
            extra=ctx(task=task_id),
        )
        await self.cancel_orphan(task_id, done)
        return done

    async def cancel_orphan(self, task_id: str, done: MoveResult) -> None:
        """Cancel the remote task a finishing move left unwanted (if any)."""
        if not done.orphan:
            return
        found = await self.rt.store.orphans_of(done.orphan)
        if found is not None:
            await self.orphans.cancel(found)
        else:
            log.debug("task %s: orphan %s already released", task_id, done.orphan)

    async def _retried(
        self, task_id: str, reason: str, attempt: int | None, machine: bool = False
    ) -> bool:
        """With ``retry_failures``, or for a machine's failure (``machine``): requeue a
        failed task that has attempts left."""
        if not (self.retry_failures or machine):
            return False
        task = await self.rt.store.get(task_id)
        if task is None or task.state.terminal:
            return False
        if task.charged >= self.rt.max_attempts(self.rt.config.account(task.aigc, task.platform)):
            return False
        live = task.attempt if attempt is None else attempt
        return await self._requeue(task_id, live, reason, delay_s=0.0, ended=True)

    async def _requeue(
        self, task_id: str, attempt: int, reason: str, *, delay_s: float, ended: bool
    ) -> bool:
        """Put ``attempt`` back for another one (only while it is the live attempt)."""
        moved = await self.rt.store.requeue_for_retry(
            task_id, attempt, reason, delay_s=delay_s, ended=ended
        )
        if moved:
            log.warning(
                "task %s: attempt %s %s, retrying",
                task_id,
                attempt,
                reason,
                extra=ctx(task=task_id),
            )
        return moved

    async def retry_or_fail(
        self,
        task_id: str,
        *,
        aigc: str,
        platform: str,
        attempt: int,
        charged: int,
        reason: str,
        code: ErrorCode = ErrorCode.TASK_TIMEOUT,
        detail: Any = None,
        ended: bool = False,
    ) -> bool:
        """Requeue ``attempt`` for another one while ``charged`` attempts leave budget, or
        fail the task. ``ended``: its remote task is known to be over (else a paid one is
        kept counted and cancelled). True when the task moved."""
        account = self.rt.config.account(aigc, platform)
        if charged < self.rt.max_attempts(account):
            return await self._requeue(
                task_id, attempt, reason, delay_s=min(charged, 10), ended=ended
            )
        error = {"code": code.value, "message": reason, "detail": detail}
        done = await self.fail(task_id, attempt, code, error, reason, ended=ended)
        if done.applied:
            log.error(
                "task %s: failed after %s attempts: %s",
                task_id,
                charged,
                reason,
                extra=ctx(task=task_id),
            )
        return done.applied

    async def retry_claimed(
        self,
        c: Claimed,
        aigc: str,
        platform: str,
        reason: str,
        code: ErrorCode = ErrorCode.TASK_FAILED,
        detail: Any = None,
    ) -> bool:
        """:meth:`retry_or_fail` for a claimed task its target answered (ran nothing)."""
        return await self.retry_or_fail(
            c.task_id,
            aigc=aigc,
            platform=platform,
            attempt=c.attempt,
            charged=c.charged,
            reason=reason,
            code=code,
            detail=detail,
            ended=True,
        )

    async def fail(
        self,
        task_id: str,
        attempt: int,
        code: ErrorCode,
        error: dict[str, Any],
        note: str,
        *,
        ended: bool = False,
    ) -> MoveResult:
        """Fail the task while ``attempt`` is its live one; cancel what that leaves
        unwanted (``ended``: its remote task is known to be over)."""
        done = await self.rt.store.finish(
            task_id,
            TaskState.FAILED,
            error=error,
            message=self.error_body(code, error),
            note=note,
            from_attempt=attempt,
            fenced=True,
            ended=ended,
        )
        await self.cancel_orphan(task_id, done)
        return done
