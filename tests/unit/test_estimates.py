"""The position and ETA estimates (scheduler/estimates.py): the planner's own layout."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from aigcq.scheduler.estimates import (
    BEYOND,
    MIN_SHIFT_S,
    PROBE_RUN_S,
    UNKNOWN,
    Estimate,
    Line,
    material,
    place_new,
    snapshot,
)
from aigcq.scheduler.policy import Pool, Shares, Waiting

NOW = 1_000_000.0


def line(project: str, n: int, run_s: float = 10.0, *, extra: int = 0, served: bool = True) -> Line:
    queue = (project, "comfyui")
    tasks = [Waiting(f"{project}-{i}", queue, NOW - 100 + i, run_s) for i in range(n)]
    return Line(queue, tasks, n + extra, served, whole=extra == 0)


def near(got: Estimate, want: Estimate) -> bool:
    """The same estimate, but for the probes' time (:data:`PROBE_RUN_S` each)."""
    if got.position != want.position or (got.eta is None) != (want.eta is None):
        return False
    return got.eta is None or abs(got.eta - (want.eta or 0)) <= PROBE_RUN_S * 8


def test_one_queue_on_two_free_slots_starts_two_at_a_time() -> None:
    snap = snapshot([line("p", 5)], Pool(2), Shares(), NOW, 10.0)
    got = [snap.tasks[f"p-{i}"] for i in range(5)]
    assert [e.position for e in got] == [0, 1, 2, 3, 4]
    assert [e.eta for e in got] == [NOW, NOW, NOW + 10, NOW + 10, NOW + 20]


def test_busy_slots_free_as_their_runs_end() -> None:
    snap = snapshot([line("p", 3)], Pool(0, 0, [4.0, 7.0]), Shares(), NOW, 10.0)
    assert [snap.tasks[f"p-{i}"].eta for i in range(3)] == [NOW + 4, NOW + 7, NOW + 14]


def test_free_slots_of_other_processes_count_as_the_pool_s() -> None:
    snap = snapshot([line("p", 2)], Pool(0, 2), Shares(), NOW, 10.0)
    assert [snap.tasks[f"p-{i}"].eta for i in range(2)] == [NOW, NOW]


def test_two_projects_share_the_pool_in_turn() -> None:
    snap = snapshot([line("a", 3), line("b", 3)], Pool(1), Shares(), NOW, 10.0)
    order = sorted(snap.tasks, key=lambda t: snap.tasks[t].position or 0)
    assert order == ["a-0", "b-0", "a-1", "b-1", "a-2", "b-2"]
    assert snap.tasks["b-2"].eta == NOW + 50


def test_no_capacity_at_all_keeps_positions_and_has_no_eta() -> None:
    snap = snapshot([line("p", 3)], Pool(0), Shares(), NOW, 10.0)
    assert [snap.tasks[f"p-{i}"] for i in range(3)] == [Estimate(0), Estimate(1), Estimate(2)]
    assert place_new(snap, ("p", "comfyui"), 3) == Estimate(3)


def test_a_queue_our_gpus_do_not_serve_counts_its_own_list() -> None:
    snap = snapshot([line("p", 2, served=False), line("q", 2)], Pool(1), Shares(), NOW, 10.0)
    assert snap.tasks["p-1"] == Estimate(1)
    assert snap.tasks["q-1"] == Estimate(1, NOW + 10)
    assert place_new(snap, ("p", "comfyui"), 2) == Estimate(2)


def test_a_new_task_takes_its_queue_s_tail_and_one_more_place_per_task_ahead() -> None:
    snap = snapshot([line("a", 2), line("b", 4)], Pool(1), Shares(), NOW, 10.0)
    # a, b, a, b, then b-2 (as much usage, and older than a task submitted now), a's tail
    assert snap.tails[("a", "comfyui")] == Estimate(5, NOW + 50)
    assert near(place_new(snap, ("a", "comfyui"), 2), Estimate(5, NOW + 50))
    assert near(place_new(snap, ("a", "comfyui"), 3), Estimate(6, NOW + 60))  # beyond the layout
    assert near(place_new(snap, ("a", "comfyui"), 9), Estimate(12, NOW + 120))
    far = place_new(snap, ("a", "comfyui"), 2 + BEYOND + 10)  # the last place laid out: at least
    assert near(far, Estimate(5 + BEYOND + 10, NOW + 50 + BEYOND * 10))
    assert near(place_new(snap, ("a", "comfyui"), 0), Estimate(3, NOW + 30))  # two left since


def test_beyond_the_window_nothing_is_known() -> None:
    snap = snapshot([line("p", 3, extra=10)], Pool(1), Shares(), NOW, 10.0)
    assert snap.tasks["p-2"] == Estimate(2, NOW + 20)
    assert place_new(snap, ("p", "comfyui"), 13) is UNKNOWN
    assert place_new(snap, ("x", "comfyui"), 0) is UNKNOWN  # a queue not read


def test_wire_form_is_epoch_ms_never_in_the_past() -> None:
    assert Estimate(3, NOW + 1.5).wire(NOW) == {"position": 3, "etaStartMs": 1_000_001_500}
    assert Estimate(0, NOW - 5).wire(NOW)["etaStartMs"] == NOW * 1000
    assert UNKNOWN.wire(NOW) == {"position": None, "etaStartMs": None}


def test_material_means_position_changed_and_eta_moved_enough() -> None:
    old = Estimate(5, NOW + 100)
    assert not material(old, Estimate(5, NOW + 10), NOW)  # same place
    assert not material(old, Estimate(4, NOW + 90), NOW)  # 10 s of 100 left: under 20 %
    assert material(old, Estimate(2, NOW + 70), NOW)
    near = Estimate(1, NOW + 3)
    assert not material(near, Estimate(0, NOW + 3 - MIN_SHIFT_S), NOW)
    assert material(near, Estimate(0, NOW), NOW)
    assert material(old, Estimate(5), NOW) and material(Estimate(5), old, NOW)
    assert not material(Estimate(5), Estimate(4), NOW)  # no ETA either way: no news
    assert not material(UNKNOWN, Estimate(3), NOW)


lines_st = st.lists(
    st.tuples(st.integers(0, 12), st.sampled_from([1.0, 5.0, 30.0]), st.booleans()),
    min_size=1,
    max_size=4,
)
pool_st = st.builds(
    Pool,
    st.integers(0, 4),
    st.integers(0, 2),
    st.lists(st.floats(0, 60, allow_nan=False), max_size=4),
)


def _lines(spec: list[tuple[int, float, bool]], extra: int = 0) -> list[Line]:
    return [
        line(f"p{i}", n, run, served=served, extra=extra) for i, (n, run, served) in enumerate(spec)
    ]


@settings(max_examples=200, deadline=None)
@given(lines_st, pool_st)
def test_positions_count_every_served_task_once_and_starts_never_go_back(
    spec: list[tuple[int, float, bool]], pool: Pool
) -> None:
    snap = snapshot(_lines(spec), pool, Shares(), NOW, 10.0)
    served = [snap.tasks[f"p{i}-{k}"] for i, (n, _, s) in enumerate(spec) if s for k in range(n)]
    assert sorted(e.position for e in served if e.position is not None) == list(range(len(served)))
    by_place = sorted(served, key=lambda e: e.position or 0)
    starts = [math.inf if e.eta is None else e.eta for e in by_place]
    assert starts == sorted(starts) == list(snap.starts)
    assert all(e.eta is None for e in served) == (pool.size == 0) or not served
    for i, (n, _, _served) in enumerate(spec):  # each queue first come, first served
        places = [snap.tasks[f"p{i}-{k}"].position for k in range(n)]
        assert places == sorted(places)


@settings(max_examples=200, deadline=None)
@given(lines_st, pool_st)
def test_the_tail_probes_move_nobody(spec: list[tuple[int, float, bool]], pool: Pool) -> None:
    with_probes = snapshot(_lines(spec), pool, Shares(), NOW, 10.0)
    without = snapshot(_lines(spec, extra=1), pool, Shares(), NOW, 10.0)  # not whole: no probes
    assert not without.tails
    for task_id, e in without.tasks.items():
        assert near(with_probes.tasks[task_id], e)
