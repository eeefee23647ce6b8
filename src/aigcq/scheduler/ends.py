"""How a task's run ended, as its subscribers hear it (see :class:`TaskEnd`)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

from aigcq.platforms.base import Failed, ResultOutcome, Succeeded

#: the ``class`` a bridge gives a failure that is the machine's, not the task's
INFRASTRUCTURE = "infrastructure"


class TaskEnd(enum.Enum):
    """How a task's run on a target ended, as its TASK_END (or a cancel) says."""

    SUCCEEDED = "succeeded"  # the target's failure count resets
    FAILED = "failed"  # the machine's failure (or cause unknown): counts against it
    REJECTED = "rejected"  # the task's own fault: the target's health is unchanged
    GONE = "gone"  # not applied: that attempt was superseded or the task is over
    CANCELLED = "cancelled"  # by its client or an admin: the target is told to stop
    #: the attempt ran past its deadline (the task was retried or failed): the target is
    #: told to stop it, its health unchanged
    TIMED_OUT = "timed-out"


#: ends after which the target is told to stop the attempt (its slot free when it says so)
STOPPED = frozenset({TaskEnd.CANCELLED, TaskEnd.TIMED_OUT})


def end_of(outcome: ResultOutcome) -> TaskEnd:
    """The :class:`TaskEnd` of an applied result."""
    if isinstance(outcome, Succeeded):
        return TaskEnd.SUCCEEDED
    if isinstance(outcome, Failed) and failure_class(outcome) == "task":
        return TaskEnd.REJECTED
    return TaskEnd.FAILED


def failure_class(outcome: Failed) -> str:
    detail = outcome.detail
    return str(detail.get("class", "")) if isinstance(detail, dict) else ""


#: hears every task's end: (taskId, target, how it ended, the attempt it was for, if known)
EndListener = Callable[[str, str, TaskEnd, "int | None"], None]

#: asked before a machine failure's retry is queued: (taskId, target, attempt) -> whether
#: the slot that attempt took is freed after (by the process holding its bridge, this one or
#: another), which then lets the retry run
SlotElsewhere = Callable[[str, str, int], Awaitable[bool]]
