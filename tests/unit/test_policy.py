"""Who runs first (issue 27): the pure policy of a round, by example and by property."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aigcq.scheduler.policy import (
    Pool,
    Queue,
    Shares,
    Tuning,
    Waiting,
    decayed,
    fair_order,
    plan_round,
    time_left,
)

NOW = 1000.0
A, B, C = ("a", "comfyui"), ("b", "comfyui"), ("c", "comfyui")
#: no margin and no rescue: the estimate alone decides
EXACT = Tuning(lend_s=-1, margin=0.0)


def tasks_of(
    queue: Queue, n: int, run_s: float = 10.0, user: str = "", start_by: float | None = None
) -> list[Waiting]:
    """``n`` tasks of ``queue`` submitted a second apart, about 100 s ago."""
    return [
        Waiting(f"{queue[0]}{i}", queue, NOW - 100 + i, run_s, user=user, start_by=start_by)
        for i in range(n)
    ]


def ids(tasks: list[Waiting]) -> list[str]:
    return [t.task_id for t in tasks]


# ---- examples -----------------------------------------------------------------------


def test_usage_halves_every_half_life() -> None:
    assert decayed(8.0, 0, 60) == 8.0
    assert decayed(8.0, 60, 60) == pytest.approx(4.0)
    assert decayed(8.0, 180, 60) == pytest.approx(1.0)
    assert decayed(8.0, 10, 0) == 0.0  # no memory


def test_a_run_is_expected_to_take_its_workflows_recent_mean() -> None:
    assert time_left(8.0, 3.0) == 5.0
    assert time_left(8.0, 30.0) == pytest.approx(0.8)  # overdue: any moment


def test_a_flood_does_not_push_back_another_project() -> None:
    flood = tasks_of(A, 50)
    late = [Waiting("b0", B, NOW - 1, 10.0)]  # submitted after the whole flood
    d = plan_round(flood + late, Pool(free=2), Shares(), {}, NOW)
    assert d.internal == {A: ["a0"], B: ["b0"]}


def test_shares_follow_gpu_time_not_task_counts() -> None:
    # a's tasks take 30 s, b's 10 s: per 30 s of a, b gets three tasks
    order = fair_order(tasks_of(A, 10, 30.0) + tasks_of(B, 10, 10.0), Shares())
    assert ids(order)[:8] == ["a0", "b0", "b1", "b2", "a1", "b3", "b4", "b5"]


def test_recent_usage_and_weights_decide_who_goes_first() -> None:
    tasks = tasks_of(A, 5) + tasks_of(B, 5)
    used = Shares(usage={"a": 40.0})
    assert ids(fair_order(tasks, used))[:5] == ["b0", "b1", "b2", "b3", "a0"]
    weighted = Shares(weights={"a": 3.0})  # a gets three slots for each of b's
    assert ids(fair_order(tasks, weighted))[:8] == ["a0", "b0", "a1", "a2", "b1", "a3", "a4", "b2"]


def test_users_share_their_project() -> None:
    flood = tasks_of(A, 20, user="u1")
    other = [Waiting("u2-0", A, NOW - 1, 10.0, user="u2")]
    d = plan_round(flood + other, Pool(free=2), Shares(), {}, NOW)
    assert d.internal == {A: ["a0", "u2-0"]}


def test_priority_credit_moves_a_task_ahead_of_its_own_tenant_only() -> None:
    mine = tasks_of(A, 4)
    urgent = Waiting("a-urgent", A, NOW - 10, 10.0, credit_s=300.0)
    other = tasks_of(B, 2)
    # equal usage: the oldest task's tenant first (b0), never the credit (issue 37 item 3);
    # inside tenant a the credit puts a-urgent before its older a0
    assert ids(fair_order([*mine, urgent, *other], Shares()))[:3] == ["b0", "a-urgent", "a0"]


def test_credit_never_moves_a_task_ahead_of_another_users_older_task() -> None:
    older = Waiting("u2-old", A, NOW - 50, 10.0, user="u2")
    urgent = Waiting("u1-urgent", A, NOW - 1, 10.0, user="u1", credit_s=300.0)
    d = plan_round([urgent, older], Pool(free=1), Shares(), {}, NOW)
    assert d.internal == {A: ["u2-old"]}


def test_without_shares_the_plan_is_first_come_first_served_by_rank() -> None:
    flood = tasks_of(A, 5)
    late = [Waiting("late", B, NOW - 1, 10.0)]
    d = plan_round(flood + late, Pool(free=5), Shares(), {}, NOW, Tuning(shares=False))
    assert d.internal == {A: ["a0", "a1", "a2", "a3", "a4"]}


def test_a_task_overflows_only_when_its_estimated_start_misses_its_deadline() -> None:
    busy = Pool(free=0, busy_s=[20.0])  # one GPU, free in 20 s
    patient = Waiting("patient", A, NOW - 1, 10.0, start_by=NOW + 30)
    hurried = Waiting("hurried", A, NOW, 10.0, start_by=NOW + 5)
    d = plan_round([patient, hurried], busy, Shares(), {A: 5}, NOW, EXACT)
    assert d.paid == {A: ["hurried"]}
    assert d.eta == {"patient": NOW + 20}
    # the same with no room on the paid platform: both wait, the hurried one behind
    full = plan_round([patient, hurried], busy, Shares(), {A: 0}, NOW, EXACT)
    assert full.paid == {} and full.eta == {"patient": NOW + 20, "hurried": NOW + 30}


def test_a_start_close_to_the_deadline_is_at_risk_by_the_margin() -> None:
    busy = Pool(free=0, busy_s=[20.0])
    close = Waiting("close", A, NOW, 10.0, start_by=NOW + 25)  # 5 s to spare of 25
    assert plan_round([close], busy, Shares(), {A: 1}, NOW, EXACT).paid == {}
    assert plan_round([close], busy, Shares(), {A: 1}, NOW, Tuning(margin=0.3)).paid == {
        A: ["close"]
    }


def test_tasks_ahead_that_overflow_make_room_in_the_estimate() -> None:
    busy = Pool(free=0, busy_s=[5.0])
    first = Waiting("first", A, NOW - 2, 10.0, start_by=NOW + 1)  # misses: paid
    second = Waiting("second", A, NOW - 1, 10.0, start_by=NOW + 8)  # then starts at +5
    d = plan_round([first, second], busy, Shares(), {A: 1}, NOW, EXACT)
    assert d.paid == {A: ["first"]} and d.eta == {"second": NOW + 5}


def test_a_task_that_would_miss_borrows_the_place_of_one_that_can_wait() -> None:
    # b's task came first (b used less), a's would miss behind it; b can wait 10 s
    relaxed = Waiting("relaxed", B, NOW, 10.0, start_by=NOW + 100)
    urgent = Waiting("urgent", A, NOW - 1, 10.0, start_by=NOW + 5)
    pool, used = Pool(free=1), Shares(usage={"a": 10.0, "b": 0.0})
    plain = plan_round([relaxed, urgent], pool, used, {}, NOW, EXACT)
    assert plain.internal == {B: ["relaxed"]} and plain.eta == {"urgent": NOW + 10}
    d = plan_round([relaxed, urgent], pool, used, {}, NOW, Tuning(lend_s=20, patience=0.5))
    assert d.internal == {A: ["urgent"]} and d.eta == {"relaxed": NOW + 10} and not d.paid


def test_a_lender_that_cannot_wait_goes_to_its_paid_platform_to_free_its_place() -> None:
    hurried = Waiting("b-hurried", B, NOW, 10.0, start_by=NOW + 12)  # cannot wait 10 s
    urgent = Waiting("urgent", A, NOW - 1, 10.0, start_by=NOW + 5)
    pool, used = Pool(free=1), Shares(usage={"a": 10.0, "b": 0.0})
    tuning = Tuning(lend_s=20, patience=0.5)
    own_room = plan_round([hurried, urgent], pool, used, {A: 1, B: 1}, NOW, tuning)
    assert own_room.paid == {A: ["urgent"]} and own_room.internal == {B: ["b-hurried"]}
    d = plan_round([hurried, urgent], pool, used, {A: 0, B: 1}, NOW, tuning)
    assert d.paid == {B: ["b-hurried"]} and d.internal == {A: ["urgent"]}


def test_the_place_free_now_goes_to_the_task_with_the_least_time_left() -> None:
    # b's two tasks can wait; a's two would miss: the one due first takes the place free
    # now, the other the place that frees in 2 s (an estimate: it could slip)
    relaxed = [Waiting(f"relaxed{i}", B, NOW, 10.0, start_by=NOW + 100) for i in range(2)]
    soon = Waiting("soon", A, NOW - 1, 10.0, start_by=NOW + 3)
    later = Waiting("later", A, NOW - 2, 10.0, start_by=NOW + 4)
    pool, used = Pool(free=1, busy_s=[2.0]), Shares(usage={"a": 10.0, "b": 0.0})
    tuning = Tuning(lend_s=20, patience=0.5, margin=0.0)
    d = plan_round([*relaxed, later, soon], pool, used, {}, NOW, tuning)
    assert d.internal == {A: ["soon"]} and d.eta["later"] == NOW + 2 and not d.paid


def test_a_task_at_risk_takes_its_paid_room_before_it_borrows() -> None:
    relaxed = Waiting("relaxed", B, NOW, 10.0, start_by=NOW + 100)
    urgent = Waiting("urgent", A, NOW - 1, 10.0, start_by=NOW + 5)
    pool, used = Pool(free=1), Shares(usage={"a": 10.0, "b": 0.0})
    tuning = Tuning(lend_s=20, patience=0.5)
    d = plan_round([relaxed, urgent], pool, used, {A: 1}, NOW, tuning)
    assert d.paid == {A: ["urgent"]} and d.internal == {B: ["relaxed"]}


def test_a_place_inside_the_borrowers_margin_is_no_loan() -> None:
    # the only place before a's deadline frees in 4 s of its last 5: inside its margin,
    # it is not lent (the estimate may slip); with a small margin it is
    relaxed = Waiting("relaxed", B, NOW, 10.0, start_by=NOW + 100)
    urgent = Waiting("urgent", A, NOW - 5, 10.0, start_by=NOW + 5)
    pool, used = Pool(free=0, busy_s=[4.0]), Shares(usage={"a": 10.0, "b": 0.0})
    strict = plan_round([relaxed, urgent], pool, used, {}, NOW, Tuning(lend_s=20, margin=0.6))
    assert strict.eta == {"relaxed": NOW + 4, "urgent": NOW + 14}
    lax = plan_round([relaxed, urgent], pool, used, {}, NOW, Tuning(lend_s=20, margin=0.1))
    assert lax.eta == {"urgent": NOW + 4, "relaxed": NOW + 14}


def test_a_tenant_far_ahead_in_usage_borrows_from_nobody() -> None:
    relaxed = Waiting("relaxed", B, NOW, 10.0, start_by=NOW + 100)
    flood = Waiting("flood", A, NOW - 1, 10.0, start_by=NOW + 5)
    pool, used = Pool(free=1), Shares(usage={"a": 500.0, "b": 0.0})
    d = plan_round([relaxed, flood], pool, used, {A: 0, B: 5}, NOW, Tuning(lend_s=20))
    assert d.internal == {B: ["relaxed"]} and not d.paid and d.eta == {"flood": NOW + 10}


def test_past_its_deadline_a_task_expires_unless_it_waits_on() -> None:
    late = Waiting("late", A, NOW - 60, 10.0, start_by=NOW - 1)
    on = Waiting("on", A, NOW - 60, 10.0, start_by=NOW - 1, keep_waiting=True)
    d = plan_round([late, on], Pool(free=0, busy_s=[5.0]), Shares(), {A: 5}, NOW)
    assert d.expired == ["late"] and d.paid == {A: ["on"]}  # never paid for the expired one
    waits = plan_round([late, on], Pool(free=0, busy_s=[5.0]), Shares(), {A: 0}, NOW)
    assert waits.expired == ["late"] and waits.eta == {"on": NOW + 5}


def test_without_a_deadline_a_task_overflows_as_before() -> None:
    tasks = tasks_of(A, 3)  # waited ~100 s
    d = plan_round(tasks, Pool(free=1), Shares(), {A: 1}, NOW)
    assert d.internal == {A: ["a0"]} and d.paid == {A: ["a1"]} and d.eta == {"a2": NOW + 10}
    young = plan_round(tasks, Pool(free=1), Shares(), {A: 1}, NOW, Tuning(overflow_after_s=500))
    assert young.paid == {} and young.recheck_at == NOW - 99 + 500


def test_slots_free_in_other_processes_are_waited_for_not_paid_around() -> None:
    d = plan_round(tasks_of(A, 3), Pool(free=1, free_elsewhere=1), Shares(), {A: 5}, NOW)
    assert d.internal == {A: ["a0"]} and d.eta["a1"] == NOW and d.paid == {A: ["a2"]}


def test_no_internal_pool_sends_everything_it_can_to_the_paid_platform() -> None:
    tasks = tasks_of(A, 3, start_by=NOW + 600)
    d = plan_round(tasks, Pool(free=0), Shares(), {A: 2}, NOW)
    assert d.paid == {A: ["a0", "a1"]} and d.eta == {"a2": math.inf}


# ---- properties -----------------------------------------------------------------------

QUEUES = [A, B, C]


@st.composite
def windows(draw: st.DrawFn) -> list[Waiting]:
    n = draw(st.integers(0, 40))
    out = []
    for i in range(n):
        queue = draw(st.sampled_from(QUEUES))
        deadline = draw(st.one_of(st.none(), st.floats(-50, 200)))
        out.append(
            Waiting(
                f"t{i}",
                queue,
                NOW - draw(st.floats(0, 100)),
                draw(st.floats(0.5, 60)),
                user=draw(st.sampled_from(["", "u1", "u2"])),
                start_by=None if deadline is None else NOW + deadline,
                keep_waiting=draw(st.booleans()),
                credit_s=draw(st.sampled_from([0.0, 0.0, 30.0])),
            )
        )
    return out


pools = st.builds(
    Pool,
    st.integers(0, 8),
    st.integers(0, 3),
    st.lists(st.floats(0, 60), max_size=8),
)
shares = st.builds(
    Shares,
    st.dictionaries(st.sampled_from("abc"), st.floats(0.1, 5)),
    st.dictionaries(st.sampled_from("abc"), st.floats(0, 500)),
)
rooms = st.dictionaries(st.sampled_from(QUEUES), st.integers(0, 5))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(), pools, shares, rooms)
def test_a_round_never_exceeds_a_cap_and_places_every_task_once(
    tasks: list[Waiting], pool: Pool, sh: Shares, room: dict[Queue, int]
) -> None:
    d = plan_round(tasks, pool, sh, room, NOW)
    internal = [t for q in d.internal.values() for t in q]
    paid = [t for q in d.paid.values() for t in q]
    assert len(internal) <= pool.free
    assert all(len(d.paid[q]) <= room.get(q, 0) for q in d.paid)
    placed = internal + paid + d.expired + list(d.eta)
    assert sorted(placed) == sorted(ids(tasks))  # each exactly once
    by_id = {t.task_id: t for t in tasks}
    for task_id in paid + internal:  # never paid for (nor run) past the deadline
        t = by_id[task_id]
        assert t.keep_waiting or t.start_by is None or t.start_by > NOW


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(), pools, shares, rooms)
def test_nothing_is_paid_while_a_slot_of_ours_is_free(
    tasks: list[Waiting], pool: Pool, sh: Shares, room: dict[Queue, int]
) -> None:
    d = plan_round(tasks, pool, sh, room, NOW)
    if any(d.paid.values()):
        granted = sum(len(q) for q in d.internal.values())
        waiting_for_others = sum(1 for at in d.eta.values() if at == NOW)  # (or a busy slot's 0 s)
        assert granted == pool.free and waiting_for_others >= pool.free_elsewhere


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(), pools, shares, rooms)
def test_a_task_whose_deadline_leaves_room_for_all_the_work_is_never_paid(
    tasks: list[Waiting], pool: Pool, sh: Shares, room: dict[Queue, int]
) -> None:
    if pool.size == 0:
        return
    horizon = NOW + max(pool.busy_s, default=0) + sum(t.run_s for t in tasks)
    d = plan_round(tasks, pool, sh, room, NOW, EXACT)
    paid = {t for q in d.paid.values() for t in q}
    for t in tasks:
        if t.start_by is not None and t.start_by >= horizon:
            assert t.task_id not in paid


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(), shares)
def test_each_tenant_is_served_in_order_of_rank(tasks: list[Waiting], sh: Shares) -> None:
    order = fair_order(tasks, sh)
    assert sorted(ids(order)) == sorted(ids(tasks))
    for who in {(t.queue[0], t.user) for t in tasks}:
        mine = [t.rank for t in order if (t.queue[0], t.user) == who]
        assert mine == sorted(mine)


def run_rounds(
    runs: dict[Queue, float], sh: Shares, rounds: int, half_life_s: float = 0.0
) -> list[Queue]:
    """Every project always has work; one slot frees per round (a second apart); usage is
    charged as the rounds grant and, with a half-life, decays. Who got each slot."""
    usage: dict[str, float] = dict(sh.usage)
    got: list[Queue] = []
    for r in range(rounds):
        window = [Waiting(f"{q[0]}-{r}-{i}", q, NOW, s) for q, s in runs.items() for i in range(2)]
        d = plan_round(window, Pool(free=1), Shares(sh.weights, usage), {}, NOW + r)
        [(queue, _)] = d.internal.items()
        got.append(queue)
        for p in usage:
            usage[p] = decayed(usage[p], 1.0, half_life_s) if half_life_s else usage[p]
        usage[queue[0]] = usage.get(queue[0], 0.0) + d.charged[queue[0]]
    return got


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(QUEUES), st.floats(1, 30), min_size=2),
    st.dictionaries(st.sampled_from("abc"), st.floats(0.2, 5)),
)
def test_shares_of_gpu_time_follow_the_weights(
    runs: dict[Queue, float], weights: dict[str, float]
) -> None:
    rounds = 120
    got = run_rounds(runs, Shares(weights), rounds)
    gpu: dict[str, float] = defaultdict(float)
    for q in got:
        gpu[q[0]] += runs[q]
    per_weight = [gpu[q[0]] / weights.get(q[0], 1.0) for q in runs]
    # water-filling: GPU-seconds per unit of weight differ by at most one task's worth
    slack = max(runs[q] / weights.get(q[0], 1.0) for q in runs)
    assert max(per_weight) - min(per_weight) <= slack + 1e-6
    assert sum(gpu.values()) == pytest.approx(sum(runs[q] for q in got))


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(QUEUES), st.floats(2, 30), min_size=2),
    st.dictionaries(st.sampled_from("abc"), st.floats(0, 300)),
    st.sampled_from([0.0, 30.0, 300.0]),
)
def test_a_tenant_with_work_waiting_is_never_starved(
    runs: dict[Queue, float], usage: dict[str, float], half_life_s: float
) -> None:
    # however much it used before, it is served once the others have caught up:
    # within the rounds it takes them to be charged its lead
    lead = max(usage.values(), default=0.0)
    bound = sum(math.ceil(lead / runs[q]) + 1 for q in runs)
    got = run_rounds(runs, Shares(usage=usage), bound, half_life_s)
    assert set(got) == set(runs)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(), shares)
def test_with_a_slot_for_everyone_every_task_runs_now(tasks: list[Waiting], sh: Shares) -> None:
    d = plan_round(tasks, Pool(free=len(tasks)), sh, {q: 10 for q in QUEUES}, NOW)
    assert not d.paid and not d.eta
    assert len(d.expired) + sum(len(q) for q in d.internal.values()) == len(tasks)
