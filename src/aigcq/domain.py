"""The task model: states, their legal transitions, and the error codes clients see (defined
in :mod:`aigcq.wire.errors`, re-exported here).

Every write of task state is one of the :class:`Move` s below, made by one Lua script in
:mod:`aigcq.queue` that declares it (``--! move``, see :mod:`aigcq.queue.scripts`). The
loader writes each declared move's from-states (``FROM``) and its to-state (``TO``) into
the script from :data:`TRANSITIONS`, and the scripts name no state of their own:
:data:`TRANSITIONS` is the single source of truth.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Any

# the codes' home is aigcq-wire (the bridge's HTTP server and the SDK share them)
from aigcq.wire.errors import ErrorCode as ErrorCode


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

#: names for several states at once, where states are chosen by name (a listing's filter)
STATE_GROUPS = {"live": LIVE_STATES, "finished": TERMINAL_STATES}


def states_named(names: str) -> frozenset[TaskState]:
    """``failed,cancelled`` or ``live`` as states (empty: none named); ``ValueError`` naming
    a word that is neither a state nor a group, and the words that are."""
    states: set[TaskState] = set()
    for word in filter(None, (w.strip().lower() for w in names.split(","))):
        if word in STATE_GROUPS:
            states |= STATE_GROUPS[word]
        elif word in {s.value for s in TaskState}:
            states.add(TaskState(word))
        else:
            known = ", ".join([*(s.value for s in TaskState), *STATE_GROUPS])
            raise ValueError(f"no state {word!r} (known: {known})")
    return frozenset(states)


class Move(enum.StrEnum):
    """The named writes of task state; each is made by one script in :mod:`aigcq.queue`."""

    SUBMIT = "submit"  # a new task joins the tail of its wait queue
    CLAIM = "claim"  # a scheduler takes a waiting task to send it to a target
    BEGIN_CREATE = "begin_create"  # a create is about to be sent for the live attempt
    MARK_RUNNING = "mark_running"  # the target accepted it
    POSTPONE = "postpone"  # its target could not say how it is doing: ask again later
    RETARGET = "retarget"  # a claimed task no instance of its target can run: to another
    # Back to waiting (each next claim is a new attempt):
    REQUEUE_UNRUN = "requeue_unrun"  # its target ran nothing: uncharged, to the head
    REQUEUE_UNSENT = "requeue_unsent"  # claimed, never sent (no create out): uncharged
    REQUEUE_FOR_RETRY = "requeue_for_retry"  # the attempt failed, timed out, was lost
    REQUEUE_HANDED_BACK = "requeue_handed_back"  # a message-dispatcher gave it back
    PROMOTE = "promote"  # a task whose back-off is over goes to the head of its queue
    FINISH = "finish"  # a result, a failure or a cancel
    WITHDRAW = "withdraw"  # its submitter took back a task that was still waiting
    #: a waiting task that never ran passed its start deadline (``maxWaitMs``): it fails
    #: ``TaskExpired``, nothing paid
    EXPIRE = "expire"
    RETRY = "retry"  # an operator queues a failed or cancelled task again
    #: an operator's replay of a failed or cancelled task whose paid run brought a result
    #: after it ended: it ends with that result, nothing is paid again
    REPLAY_RESULT = "replay_result"
    #: a paid run's success that came after its task failed ``UncertainSubmit`` (its
    #: create's outcome unknown at the deadline), from that same attempt: it wins
    LATE_SUCCESS = "late_success"


_BACK_TO_WAITING = (
    frozenset({TaskState.DISPATCHING, TaskState.RUNNING}),
    frozenset({TaskState.PENDING}),
)

#: move -> (the states it may start from, the states it may lead to)
TRANSITIONS: dict[Move, tuple[frozenset[TaskState], frozenset[TaskState]]] = {
    Move.SUBMIT: (frozenset(), frozenset({TaskState.PENDING})),  # from no task at all
    Move.CLAIM: (frozenset({TaskState.PENDING}), frozenset({TaskState.DISPATCHING})),
    Move.BEGIN_CREATE: (frozenset({TaskState.DISPATCHING}), frozenset({TaskState.DISPATCHING})),
    Move.MARK_RUNNING: (frozenset({TaskState.DISPATCHING}), frozenset({TaskState.RUNNING})),
    Move.POSTPONE: (
        frozenset({TaskState.DISPATCHING, TaskState.RUNNING}),
        frozenset({TaskState.DISPATCHING, TaskState.RUNNING}),
    ),
    Move.RETARGET: (frozenset({TaskState.DISPATCHING}), frozenset({TaskState.DISPATCHING})),
    # The platform may answer "full" or "not sent" after the sweeper took a create that
    # may be out as running (awaiting its webhook): such a task ran nothing either.
    Move.REQUEUE_UNRUN: _BACK_TO_WAITING,
    Move.REQUEUE_UNSENT: (frozenset({TaskState.DISPATCHING}), frozenset({TaskState.PENDING})),
    Move.REQUEUE_FOR_RETRY: _BACK_TO_WAITING,
    # only a running task carries the remote id the hand-back names
    Move.REQUEUE_HANDED_BACK: (frozenset({TaskState.RUNNING}), frozenset({TaskState.PENDING})),
    Move.PROMOTE: (frozenset({TaskState.PENDING}), frozenset({TaskState.PENDING})),
    # A result is accepted from any live state: the first result wins, even one that
    # arrives for an earlier attempt after the task was handed back to the queue.
    Move.FINISH: (LIVE_STATES, TERMINAL_STATES),
    Move.WITHDRAW: (frozenset({TaskState.PENDING}), frozenset({TaskState.CANCELLED})),
    Move.EXPIRE: (frozenset({TaskState.PENDING}), frozenset({TaskState.FAILED})),
    Move.RETRY: (
        frozenset({TaskState.FAILED, TaskState.CANCELLED}),
        frozenset({TaskState.PENDING}),
    ),
    Move.REPLAY_RESULT: (
        frozenset({TaskState.FAILED, TaskState.CANCELLED}),
        frozenset({TaskState.SUCCESS}),
    ),
    Move.LATE_SUCCESS: (frozenset({TaskState.FAILED}), frozenset({TaskState.SUCCESS})),
}

#: Moves that write a task but leave its state as it was (its create, its deadline, its
#: target, its place among the waiting): each of their from-states leads to itself only.
KEEPS_STATE = frozenset({Move.BEGIN_CREATE, Move.POSTPONE, Move.RETARGET, Move.PROMOTE})


def can_transition(current: TaskState, to: TaskState) -> bool:
    """Whether some move leads from ``current`` to ``to``."""
    return any(
        current in src and to in dst and (move not in KEEPS_STATE or to is current)
        for move, (src, dst) in TRANSITIONS.items()
    )


@functools.cache
def from_states(move: Move) -> str:
    """The states ``move`` starts from, comma-separated in a stable order: the ``FROM`` a
    script checks a task's state against (:mod:`aigcq.queue.scripts`)."""
    return ",".join(sorted(s.value for s in TRANSITIONS[move][0]))


def allowed_from(move: Move, to: TaskState) -> str:
    """:func:`from_states` of ``move``, which must lead to ``to``."""
    if to not in TRANSITIONS[move][1]:
        raise ValueError(f"{move} does not lead to {to}")
    return from_states(move)


@dataclass(frozen=True, slots=True)
class Ordering:
    """What a client asked about when its task runs (issue 27; docs/scheduling.md): its end
    user (fair shares inside the project), a priority credit, a start deadline, and
    whether it waits on past that deadline. The default is a task as before issue 27."""

    user: str = ""
    #: dispatched among its tenant's tasks as if submitted this many seconds earlier
    credit_s: float = 0.0
    #: it must start within this many seconds of its submit (None: no deadline)
    max_wait_s: float | None = None
    #: past its start deadline it waits on (else it ends ``TaskExpired``)
    keep_waiting: bool = False

    def start_by(self, created: float) -> float | None:
        """Its start deadline (epoch s) for a submit at ``created``."""
        return None if self.max_wait_s is None else created + self.max_wait_s

    def fields(self, created: float) -> list[str]:
        """Its task hash's fields (name, value, ...): only those that differ from the
        default, so a task without them is stored as before."""
        out: list[str] = []
        if self.user:
            out += ["userId", self.user]
        if self.credit_s:
            out += ["credit", repr(float(self.credit_s))]
        start_by = self.start_by(created)
        if start_by is not None:
            out += ["startBy", repr(start_by)]
        if self.keep_waiting:
            out += ["keepWaiting", "1"]
        return out


#: a task as before issue 27: no user, no credit, no start deadline
AS_SUBMITTED = Ordering()


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
    #: its OpenTelemetry trace context, a W3C traceparent ("": not traced; docs/tracing.md)
    trace: str = ""

    @property
    def failure(self) -> dict[str, str | None] | None:
        """Why the task failed, as every view shows it: :func:`failure_of` its error."""
        return failure_of(self.error)


def failure_of(error: dict[str, Any] | None) -> dict[str, str | None] | None:
    """A task's error (``{code, message, detail}``, as stored and as its result carries it)
    as every view shows it, ``None`` for none: ``class`` (``task``: its own fault,
    ``infrastructure``: the machine's, ``None``: not said), ``code`` (``PromptValidation``,
    ``TaskTimeout``...) and ``message``."""
    if not error:
        return None
    detail = error.get("detail")
    failure_class = detail.get("class") if isinstance(detail, dict) else None
    return {
        "class": str(failure_class) if failure_class else None,
        "code": str(error.get("code") or ""),
        "message": str(error.get("message") or ""),
    }
