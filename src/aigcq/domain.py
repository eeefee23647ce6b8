"""The task model: states, their legal transitions, and the error codes clients see.

Every write of task state is one of the :class:`Move` s below, made by one Lua script in
:mod:`aigcq.queue`, which passes the move's allowed *from* states (:func:`allowed_from`)
into the script: :data:`TRANSITIONS` is the single source of truth.
"""

from __future__ import annotations

import enum
import functools
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

LIVE_STATES = frozenset({TaskState.PENDING, TaskState.DISPATCHING, TaskState.RUNNING})


class Move(enum.StrEnum):
    """The named writes of task state; each is one script in :mod:`aigcq.queue`."""

    CLAIM = "claim"  # a scheduler takes a waiting task to send it to a target
    MARK_RUNNING = "mark_running"  # the target accepted it
    REQUEUE = "requeue"  # back to waiting: the target lost it, refused it, or timed out
    FINISH = "finish"  # a result, a failure or a cancel
    WITHDRAW = "withdraw"  # its submitter took back a task that was still waiting
    RETRY = "retry"  # an operator queues a failed or cancelled task again
    RETARGET = "retarget"  # a claimed task no instance of its target can run: to another


#: move -> (the states it may start from, the states it may lead to)
TRANSITIONS: dict[Move, tuple[frozenset[TaskState], frozenset[TaskState]]] = {
    Move.CLAIM: (frozenset({TaskState.PENDING}), frozenset({TaskState.DISPATCHING})),
    Move.MARK_RUNNING: (frozenset({TaskState.DISPATCHING}), frozenset({TaskState.RUNNING})),
    Move.REQUEUE: (
        frozenset({TaskState.DISPATCHING, TaskState.RUNNING}),
        frozenset({TaskState.PENDING}),
    ),
    # A result is accepted from any live state: the first result wins, even one that
    # arrives for an earlier attempt after the task was handed back to the queue.
    Move.FINISH: (LIVE_STATES, TERMINAL_STATES),
    Move.WITHDRAW: (frozenset({TaskState.PENDING}), frozenset({TaskState.CANCELLED})),
    Move.RETRY: (
        frozenset({TaskState.FAILED, TaskState.CANCELLED}),
        frozenset({TaskState.PENDING}),
    ),
    Move.RETARGET: (frozenset({TaskState.DISPATCHING}), frozenset({TaskState.DISPATCHING})),
}


def can_transition(current: TaskState, to: TaskState) -> bool:
    """Whether some move leads from ``current`` to ``to``."""
    return any(current in src and to in dst for src, dst in TRANSITIONS.values())


@functools.cache
def allowed_from(move: Move, to: TaskState) -> str:
    """The from-states of ``move`` as a comma-separated list, in a stable order (for Lua
    ARGV); ``to`` must be one of the states the move leads to."""
    src, dst = TRANSITIONS[move]
    if to not in dst:
        raise ValueError(f"{move} does not lead to {to}")
    return ",".join(sorted(s.value for s in src))


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
    UNCERTAIN_SUBMIT = "UncertainSubmit"


@dataclass(slots=True)
class Task:
    """A task as stored in its Redis hash ``{prefix}:task:{taskId}``."""

    task_id: str
    platform: str
    aigc: str
    backend_id: str
    payload: dict[str, Any]
    state: TaskState = TaskState.PENDING
    #: dispatches so far (each one a new number: its own signed webhook URL)
    attempt: int = 0
    #: attempts charged to the task's budget (a dispatch the target never ran is not)
    charged: int = 0
    #: set while a create may be out for the live attempt (recorded before it is sent)
    create_id: str = ""
    create_at: float = 0.0
    target: str = ""
    remote_id: str = ""
    #: the workflow or model the payload names (``queue.store.workflow_of``)
    workflow_id: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    deadline: float = 0.0
    result: Any = None
    error: dict[str, Any] | None = None
    extra: dict[str, str] = field(default_factory=dict)
