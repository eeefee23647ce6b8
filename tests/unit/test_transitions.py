"""The task state machine: every write names a move, and the move's table decides."""

from __future__ import annotations

from importlib import resources

import pytest

from aigcq.domain import (
    KEEPS_STATE,
    LIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    Move,
    TaskState,
    allowed_from,
    can_transition,
    from_states,
)
from aigcq.queue import scripts
from aigcq.queue.store import SCRIPTS


def test_every_move_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(Move)


def test_an_operators_retry_or_replay_or_a_late_success_is_the_only_way_out() -> None:
    for state in TERMINAL_STATES:
        leaving = {m for m, (src, _) in TRANSITIONS.items() if state in src}
        assert leaving <= {Move.RETRY, Move.REPLAY_RESULT, Move.LATE_SUCCESS}
    assert allowed_from(Move.LATE_SUCCESS, TaskState.SUCCESS) == "failed"
    assert allowed_from(Move.RETRY, TaskState.PENDING) == "cancelled,failed"
    assert allowed_from(Move.REPLAY_RESULT, TaskState.SUCCESS) == "cancelled,failed"
    assert not can_transition(TaskState.SUCCESS, TaskState.PENDING)


def test_requeue_cannot_revive_a_finished_task() -> None:
    assert allowed_from(Move.REQUEUE_FOR_RETRY, TaskState.PENDING) == "dispatching,running"
    assert allowed_from(Move.REQUEUE_UNRUN, TaskState.PENDING) == "dispatching,running"
    assert not can_transition(TaskState.PENDING, TaskState.RUNNING)


def test_withdraw_only_takes_back_a_waiting_task() -> None:
    assert allowed_from(Move.WITHDRAW, TaskState.CANCELLED) == "pending"


def test_a_result_is_accepted_from_any_live_state() -> None:
    for to in TERMINAL_STATES:
        assert allowed_from(Move.FINISH, to) == ",".join(sorted(s.value for s in LIVE_STATES))


def test_a_move_cannot_name_a_state_it_does_not_lead_to() -> None:
    with pytest.raises(ValueError):
        allowed_from(Move.CLAIM, TaskState.RUNNING)


# ---- every script that writes task state makes a move of the table ----------------------

REQUEUES = {
    Move.REQUEUE_UNRUN,
    Move.REQUEUE_UNSENT,
    Move.REQUEUE_FOR_RETRY,
    Move.REQUEUE_HANDED_BACK,
}


def test_every_move_back_to_waiting_leaves_a_live_task_for_pending() -> None:
    for move in REQUEUES:
        src, dst = TRANSITIONS[move]
        assert src and src <= LIVE_STATES - {TaskState.PENDING}, move
        assert dst == {TaskState.PENDING}, move
    assert allowed_from(Move.REQUEUE_UNSENT, TaskState.PENDING) == "dispatching"
    assert allowed_from(Move.REQUEUE_HANDED_BACK, TaskState.PENDING) == "running"


def test_a_move_that_keeps_the_state_leads_nowhere_else() -> None:
    for move in KEEPS_STATE:
        src, dst = TRANSITIONS[move]
        assert src == dst, move
    # postpone may start from dispatching or running, yet never turns one into the other
    assert not can_transition(TaskState.RUNNING, TaskState.DISPATCHING)
    assert can_transition(TaskState.RUNNING, TaskState.RUNNING)


def test_submit_starts_from_no_task() -> None:
    assert from_states(Move.SUBMIT) == ""
    assert TRANSITIONS[Move.SUBMIT][1] == {TaskState.PENDING}


def test_every_move_is_made_by_exactly_one_script() -> None:
    made = [m for name in SCRIPTS for m in scripts.load(name).moves]
    assert sorted(made) == sorted(Move)


def test_a_script_with_no_move_says_why() -> None:
    for name in SCRIPTS:
        script = scripts.load(name)
        assert bool(script.moves) != bool(script.no_move), name
    assert [n for n in SCRIPTS if not scripts.load(n).moves] == [
        "window",
        "charge",
        "budget",
        "pause_workflow",
        "keyed",
    ]


def _code(name: str) -> str:
    """The body of script ``name`` without its comments."""
    body = (resources.files("aigcq.queue") / "lua" / f"{name}.lua").read_text()
    return "\n".join(line.split("--", 1)[0] for line in body.splitlines())


@pytest.mark.parametrize("name", [*SCRIPTS, "_prelude"])
def test_no_script_names_a_state_of_its_own(name: str) -> None:
    """States come from TRANSITIONS (``FROM``, ``TO``) or ``TaskState`` (``PENDING``)."""
    code = _code(name)
    for state in TaskState:
        assert f"'{state.value}'" not in code and f'"{state.value}"' not in code, (name, state)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_checks_each_of_its_moves_from_states(name: str) -> None:
    code = _code(name)
    moves = scripts.load(name).moves
    for move in moves:
        if TRANSITIONS[move][0]:  # submit starts from no task: it checks none exists
            shared = len(moves) > 1 and "FROM[move]" in code
            assert shared or f"FROM.{move.value}" in code, (name, move)


def test_the_generated_from_and_to_are_the_tables() -> None:
    source = scripts.load("requeue").source
    assert "requeue_unsent = 'dispatching'" in source
    assert "requeue_handed_back = 'running'" in source
    assert "local TO = {requeue_unrun = 'pending'," in source
    # a move to several states (finish) has no TO: the caller names the state
    assert "local TO = {withdraw = 'cancelled', replay_result = 'success', expire = 'failed'}" in (
        scripts.load("finish").source
    )
