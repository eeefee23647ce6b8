"""The polling cadence of seed 001 §5B: batches of 100, every 5–30 s by load."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aigcq.scheduler.poller import POLL_BATCH, next_poll_interval


def test_batches_of_100() -> None:
    assert POLL_BATCH == 100


def test_poll_interval_bounds() -> None:
    assert next_poll_interval(0) == 30.0
    assert next_poll_interval(-3) == 30.0
    assert next_poll_interval(50) == 5.0
    assert next_poll_interval(10_000) == 5.0
    assert next_poll_interval(25) == 17.5


@given(st.integers(-10, 1000), st.integers(-10, 1000))
def test_poll_interval_is_monotonic(a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert 5.0 <= next_poll_interval(high) <= next_poll_interval(low) <= 30.0
