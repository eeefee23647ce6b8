"""The dashboard's latency figures: nearest-rank percentiles."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aigcq.serve.admin_trends import percentile


def test_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0
    assert percentile([], 0.5) is None and percentile([3.0], 0.99) == 3.0


@given(st.lists(st.floats(0, 1e4), min_size=1), st.floats(0.01, 1))
def test_a_percentile_is_one_of_the_values_and_monotone(values: list[float], share: float) -> None:
    ordered = sorted(values)
    p = percentile(ordered, share)
    assert p is not None and ordered[0] - 1e-3 <= p <= ordered[-1] + 1e-3
    assert p <= (percentile(ordered, 1.0) or 0) + 1e-3
