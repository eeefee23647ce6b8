"""The chaos run's two GPU figures (bench/gpu_idle.py): idle GPU-seconds while a task
waited, and paid creates made while an instance had been free for more than 200 ms."""

from __future__ import annotations

from bench.gpu_idle import (
    Timeline,
    complement,
    gpu_idle_s,
    intersect,
    longest_idle,
    merged,
    paid_while_free,
    waiting_spans,
)
from hypothesis import given
from hypothesis import strategies as st

spans = st.lists(
    st.tuples(st.floats(0, 100), st.floats(0, 10)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=12,
)


@given(spans)
def test_a_span_and_its_complement_cover_the_window_once(found: list[tuple[float, float]]) -> None:
    busy = intersect(merged(found), [(0.0, 100.0)])
    free = complement(found, 0.0, 100.0)
    assert intersect(busy, free) == []
    covered = sum(e - s for s, e in busy) + sum(e - s for s, e in free)
    assert abs(covered - 100.0) < 1e-6


def test_waiting_holds_from_one_sample_to_the_next() -> None:
    samples = [(0.0, 0), (1.0, 2), (2.0, 1), (3.0, 0), (4.0, 5), (5.0, 0)]
    assert waiting_spans(samples) == [(1.0, 3.0), (4.0, 5.0)]


def run(**kw: object) -> Timeline:
    return Timeline(start=0.0, end=20.0, **kw)  # type: ignore[arg-type]


def test_an_idle_gap_counts_beyond_its_first_second() -> None:
    # instance a idle 5..9 while a task waited 4..12: 4 s idle, 3 s beyond the grace
    waiting = {"a": [(4.0, 1), (12.0, 0)]}
    timeline = run(busy={"a": [(0.0, 5.0), (9.0, 20.0)]}, waiting=waiting)
    assert gpu_idle_s(timeline) == 3.0


def test_idle_with_nothing_waiting_or_while_unusable_is_not_counted() -> None:
    busy = {"a": [(0.0, 5.0), (9.0, 20.0)]}
    assert gpu_idle_s(run(busy=busy, waiting={"a": [(0.0, 0), (20.0, 0)]})) == 0.0
    waiting = {"a": [(4.0, 1), (12.0, 0)]}
    unusable = run(busy=busy, waiting=waiting, out={"a": [(4.5, 10.0)]})
    assert gpu_idle_s(unusable) == 0.0


def test_idle_while_only_tasks_it_cannot_run_wait_is_not_counted() -> None:
    busy = {"a": [(0.0, 5.0), (9.0, 20.0)], "b": [(0.0, 20.0)]}
    waiting = {"a": [(0.0, 0), (20.0, 0)], "b": [(4.0, 2), (12.0, 0)]}
    assert gpu_idle_s(run(busy=busy, waiting=waiting)) == 0.0


def test_a_short_gap_between_prompts_is_not_idle() -> None:
    timeline = run(busy={"a": [(0.0, 5.0), (5.3, 20.0)]}, waiting={"a": [(0.0, 3), (20.0, 0)]})
    assert gpu_idle_s(timeline) == 0.0


def test_a_create_counts_only_when_an_instance_had_been_free_over_200ms() -> None:
    timeline = run(busy={"a": [(0.0, 5.0), (6.0, 20.0)], "b": [(0.0, 20.0)]})
    both = frozenset({"a", "b"})
    creates = [(4.0, both), (5.1, both), (5.5, both), (6.5, both)]  # a: busy, free 0.1 s,
    assert paid_while_free(timeline, creates) == 1  # free 0.5 s, busy again
    assert paid_while_free(timeline, [(5.5, frozenset({"b"}))]) == 0  # a cannot run it


def test_a_create_while_the_free_instance_is_unusable_is_not_counted() -> None:
    timeline = run(busy={"a": [(0.0, 5.0), (9.0, 20.0)]}, out={"a": [(5.0, 9.0)]})
    assert paid_while_free(timeline, [(7.0, frozenset({"a"}))]) == 0


def test_each_create_names_the_instance_idle_longest_then() -> None:
    timeline = run(busy={"a": [(0.0, 5.0), (9.0, 20.0)], "b": [(0.0, 4.0), (8.0, 20.0)]})
    both = frozenset({"a", "b"})
    found = longest_idle(timeline, [(3.0, both), (6.0, both), (6.0, frozenset({"a"}))])
    assert found == [None, ("b", 2.0), ("a", 1.0)]
