"""The task model: states, their legal transitions, and the error codes clients see.

Every write of task state happens in :mod:`aigcq.queue`, which passes the allowed
*from* states below into its Lua scripts, so this table is the single source of truth.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class TaskState(enum.StrEnum):
    PENDING = "pending"  # in a wait queue (or delayed for backoff)
    DISPATCHING = "dispatching"  # claimed by a scheduler, being sent to a target
    RUNNING = "running"  # accepted by a target, waiting for its result
    SUCCESS = "success"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({TaskState.SUCCESS, TaskState.FAILED, TaskState.CANCELLED})

#: to-state -> the states it may be entered from.
TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.DISPATCHING: frozenset({TaskState.PENDING}),
    TaskState.RUNNING: frozenset({TaskState.DISPATCHING}),
    TaskState.PENDING: frozenset({TaskState.DISPATCHING, TaskState.RUNNING}),
    # A result is accepted from any live state: the first result wins, even one that
    # arrives for an earlier attempt after the task was handed back to the queue.
    TaskState.SUCCESS: frozenset({TaskState.PENDING, TaskState.DISPATCHING, TaskState.RUNNING}),
    TaskState.FAILED: frozenset({TaskState.PENDING, TaskState.DISPATCHING, TaskState.RUNNING}),
    TaskState.CANCELLED: frozenset({TaskState.PENDING, TaskState.DISPATCHING, TaskState.RUNNING}),
}


def can_transition(current: TaskState, to: TaskState) -> bool:
    return current in TRANSITIONS[to]


def allowed_from(to: TaskState) -> list[str]:
    """The from-states for ``to`` as plain strings, in a stable order (for Lua ARGV)."""
    return sorted(s.value for s in TRANSITIONS[to])


class ErrorCode(enum.StrEnum):
    """Client-visible error codes. The first four are the seed's code.json keys."""

    JSON = "JSONError"
    OPCODE = "OpcodeError"
    BALANCE = "BalanceError"
    ASSESSMENT = "AssessmentError"
    AUTH = "AuthError"
    PLATFORM = "PlatformError"
    PAYLOAD_TOO_LARGE = "PayloadTooLarge"
    NOT_FOUND = "TaskNotFound"
    CONFLICT = "TaskConflict"
    TASK_FAILED = "TaskFailed"
    TASK_TIMEOUT = "TaskTimeout"
    TASK_CANCELLED = "TaskCancelled"
    SIGNATURE = "SignatureError"
    GONE = "TaskGone"
    NOT_RETRYABLE = "TaskNotRetryable"


@dataclass(slots=True)
class Task:
    """A task as stored in its Redis hash ``{prefix}:task:{taskId}``."""

    task_id: str
    platform: str
    aigc: str
    backend_id: str
    payload: dict[str, Any]
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    target: str = ""
    remote_id: str = ""
    workflow_id: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    deadline: float = 0.0
    result: Any = None
    error: dict[str, Any] | None = None
    extra: dict[str, str] = field(default_factory=dict)
