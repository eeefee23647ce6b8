"""The dashboard's figures: nearest-rank latency percentiles; finished tasks summed per bucket."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aigcq.serve.admin_trends import Split, percentile


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


def test_the_split_sums_each_bucket_and_keeps_the_last_ones() -> None:
    """A count a second zigzags between 0 and 1; per 10 s bucket it reads as a rate."""
    split = Split(bucket_s=10, buckets=2)
    for second in range(100, 125):  # a task every other second, internal; one external
        split.add(second + 0.5, second % 2, int(second == 111))
    view = split.view()
    assert view["bucketS"] == 10 and view["totals"] == {"internal": 12, "external": 1}
    assert view["history"] == [  # 100-109 fell off; 120-124 is the bucket still filling
        {"t": 110, "internal": 5, "external": 1},
        {"t": 120, "internal": 2, "external": 0},
    ]
