"""How soon a TASK_END the hub did not take is sent again (``aigcq.agent.spool``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aigcq.agent.spool import STORE_OUTAGE_RETRY_S, retry_delay


@given(st.integers(1, 30))
def test_after_a_503_the_next_try_comes_within_half_a_second(attempt: int) -> None:
    # the hub answered: only its Redis is out, and the TASK_END's slot stays taken meanwhile
    assert 0 < retry_delay(attempt, 503, 60.0) <= STORE_OUTAGE_RETRY_S


@given(st.integers(1, 30), st.sampled_from([None, 500, 502, 429]))
def test_other_failures_back_off_up_to_the_cap(attempt: int, status: int | None) -> None:
    delay = retry_delay(attempt, status, 60.0)
    assert 0.5 * min(60.0, 2.0 ** (attempt - 1)) <= delay <= min(60.0, 2.0 ** (attempt - 1))
