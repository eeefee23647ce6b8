"""The task state machine: every write names a move, and the move's table decides."""

from __future__ import annotations

import pytest

from aigcq.domain import (
    LIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    Move,
    TaskState,
    allowed_from,
    can_transition,
)


def test_every_move_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(Move)


def test_an_operator_retry_is_the_only_way_out_of_a_terminal_state() -> None:
    for state in TERMINAL_STATES:
        leaving = {m for m, (src, _) in TRANSITIONS.items() if state in src}
        assert leaving <= {Move.RETRY}
    assert allowed_from(Move.RETRY, TaskState.PENDING) == "cancelled,failed"


def test_requeue_cannot_revive_a_finished_task() -> None:
    assert allowed_from(Move.REQUEUE, TaskState.PENDING) == "dispatching,running"
    assert not can_transition(TaskState.PENDING, TaskState.RUNNING)


def test_withdraw_only_takes_back_a_waiting_task() -> None:
    assert allowed_from(Move.WITHDRAW, TaskState.CANCELLED) == "pending"


def test_a_result_is_accepted_from_any_live_state() -> None:
    for to in TERMINAL_STATES:
        assert allowed_from(Move.FINISH, to) == ",".join(sorted(s.value for s in LIVE_STATES))


def test_a_move_cannot_name_a_state_it_does_not_lead_to() -> None:
    with pytest.raises(ValueError):
        allowed_from(Move.CLAIM, TaskState.RUNNING)
