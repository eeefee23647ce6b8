"""Seed 000 §3.6.2's table as a test, plus properties of the split and the fair share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aigcq.scheduler.routing import Plan, plan, share_round_robin


@pytest.mark.parametrize(
    ("backlog", "internal", "external", "expected"),
    [
        (25, 30, 10, Plan(25, 0, 0)),  # scenario 1: all internal
        (45, 30, 10, Plan(30, 10, 5)),  # scenario 2: 30 internal, 10 RunningHub, 5 wait
        (30, 30, 10, Plan(30, 0, 0)),  # exactly the internal capacity
        (5, 0, 10, Plan(0, 5, 0)),  # no internal capacity: overflow only
        (5, 0, 0, Plan(0, 0, 5)),  # nothing free: keep waiting
        (0, 30, 10, Plan(0, 0, 0)),
    ],
)
def test_seed_000_split_table(backlog: int, internal: int, external: int, expected: Plan) -> None:
    assert plan(backlog, internal, external) == expected


@given(st.integers(0, 10_000), st.integers(-5, 10_000), st.integers(-5, 10_000))
def test_plan_conserves_tasks_and_respects_caps(backlog: int, internal: int, external: int) -> None:
    p = plan(backlog, internal, external)
    assert p.internal + p.external + p.waiting == backlog
    assert 0 <= p.internal <= max(internal, 0)
    assert 0 <= p.external <= max(external, 0)
    # internal first: nothing overflows while internal capacity is left
    assert p.external == 0 or p.internal == max(internal, 0)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(0, 200), st.integers(0, 7))
def test_round_robin_share_is_fair_and_complete(demands: list[int], cap: int, start: int) -> None:
    shares = share_round_robin(demands, cap, start)
    assert all(0 <= s <= d for s, d in zip(shares, demands, strict=True))
    assert sum(shares) == min(cap, sum(demands))
    unsatisfied = [s for s, d in zip(shares, demands, strict=True) if s < d]
    if unsatisfied:
        assert max(shares) - min(unsatisfied) <= 1


def test_round_robin_starts_where_told() -> None:
    assert share_round_robin([5, 5, 5], 2, start=1) == [0, 1, 1]


@pytest.mark.parametrize(
    ("backlog", "mine", "external", "elsewhere", "expected"),
    [
        (3, 0, 10, 5, Plan(0, 0, 3)),  # other processes' bridges can take all: none paid
        (8, 2, 10, 3, Plan(2, 3, 3)),  # ours first, theirs wait, overflow the rest
        (8, 2, 1, 3, Plan(2, 1, 5)),  # ... up to the external cap
        (4, 4, 10, 3, Plan(4, 0, 0)),
    ],
)
def test_slots_of_other_processes_hold_back_overflow(
    backlog: int, mine: int, external: int, elsewhere: int, expected: Plan
) -> None:
    assert plan(backlog, mine, external, elsewhere) == expected


@given(
    st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 10_000)
)
def test_overflow_only_beyond_all_internal_capacity(
    backlog: int, mine: int, external: int, elsewhere: int
) -> None:
    p = plan(backlog, mine, external, elsewhere)
    assert p.internal + p.external + p.waiting == backlog
    assert p.external == 0 or p.external <= backlog - mine - elsewhere
    assert p.internal == min(backlog, mine)
