"""The health state machine (seed 000 §8), the bridge check and the overflow delay rule."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from aigcq.bridges.health_monitor import check_bridges
from aigcq.bridges.known import CLOSED, SILENT, Standing
from aigcq.bridges.registry import BridgeConn
from aigcq.bridges.slots import SlotLedger
from aigcq.health import Health, HealthState
from aigcq.scheduler.routing import overflow_ready

FAIL, PASS = "no bridge connected", ""


def proven(**kwargs: int) -> Health:
    """Health whose capacity has passed a check once (so a failure must be recovered from)."""
    h = Health(**kwargs)
    h.observe(PASS)
    return h


def test_a_failure_degrades_at_once_and_three_passes_recover() -> None:
    h = proven()
    assert h.healthy
    assert h.observe(FAIL) is HealthState.DEGRADED and h.reason == FAIL
    assert h.observe(PASS) is HealthState.RECOVERING
    assert h.observe(PASS) is None and h.passes == 2 and not h.healthy
    assert h.observe(PASS) is HealthState.HEALTHY and h.reason == ""
    assert (h.degrades, h.recovers) == (1, 1)


def test_a_failure_while_recovering_starts_over_without_counting_a_new_degrade() -> None:
    h = proven()
    h.observe(FAIL)
    h.observe(PASS)
    assert h.observe("no instances") is HealthState.DEGRADED
    assert h.passes == 0 and h.degrades == 1
    for _ in range(2):
        h.observe(PASS)
    assert not h.healthy


def test_one_pass_recovers_when_configured_so() -> None:
    h = proven(recover_passes=1)
    h.observe(FAIL)
    assert h.observe(PASS) is HealthState.HEALTHY


def test_the_first_pass_ever_is_healthy_at_once() -> None:
    h = Health()  # e.g. a server started before its GPUs' bridges
    assert h.observe(FAIL) is HealthState.DEGRADED
    assert h.observe(FAIL) is None
    assert h.observe(PASS) is HealthState.HEALTHY  # nothing had failed that could flap
    assert h.observe(FAIL) is HealthState.DEGRADED
    assert h.observe(PASS) is HealthState.RECOVERING  # from now on: the stability period


def test_a_fresh_pass_restores_health_at_once_whatever_the_failure() -> None:
    """A bridge in good standing registered: its capacity has not failed (issue 24.6)."""
    for failure in (FAIL, "no heartbeat within 60 s", "every bridge is out of rotation"):
        h = proven()
        h.observe(failure)
        assert h.observe(PASS, fresh=True) is HealthState.HEALTHY
        assert (h.degrades, h.recovers, h.passes) == (1, 1, 0)


def test_a_fresh_failure_is_still_a_failure() -> None:
    h = proven()
    assert h.observe(FAIL, fresh=True) is HealthState.DEGRADED


def test_a_pass_that_is_not_fresh_waits_for_the_stability_period() -> None:
    h = proven()
    h.observe(FAIL)
    assert h.observe(PASS) is HealthState.RECOVERING
    assert h.observe(PASS, fresh=True) is HealthState.HEALTHY  # then a new bridge came


def test_a_bridges_standing_from_its_shared_record() -> None:
    assert Standing.of({}) == Standing() and Standing().fresh  # never seen: new
    closed = Standing.of({"online": "0", "left": CLOSED, "leftAt": "12.5", "process": "p1"})
    assert closed.known and closed.fresh and closed.left_at == 12.5 and not closed.online
    assert closed.describe("p2") == "known, moved here"
    assert closed.describe("p1") == "known, back"
    silent = Standing.of({"online": "0", "left": SILENT, "leftAt": "12.5"})
    assert not silent.fresh and silent.describe("p1") == "known, back after going silent"
    out = Standing.of({"online": "1", "quarantinedAt": "99.25", "failures": "3"})
    assert not out.fresh and (out.quarantined_at, out.failures) == (99.25, 3)
    since = Standing.of({"quarantinedAt": str(time.time() - 30)}).out_since()
    assert since is not None and 29 < time.monotonic() - since < 31  # the cool-down goes on
    assert closed.out_since() is None
    # what an older version wrote (no standing fields), or garbage: nothing failed
    old = Standing.of({"online": "1", "inRotation": "1", "quarantinedAt": "", "leftAt": "x"})
    assert old.fresh and old.online and old.left_at is None and old.quarantined_at is None


@given(st.lists(st.booleans(), max_size=60), st.integers(1, 5))
def test_never_healthy_before_n_consecutive_passes_after_a_failure(
    checks: list[bool], n: int
) -> None:
    h = Health(recover_passes=n)
    streak, failed, passes = 0, False, 0
    for passed in checks:
        h.observe(PASS if passed else FAIL)
        streak = streak + 1 if passed else 0
        passes += passed
        failed = failed or not passed
        if not passed:
            assert h.state is HealthState.DEGRADED
        first_streak = streak > 0 and streak == passes  # no check had passed before it
        assert h.healthy == (not failed or streak >= n or first_streak)
    assert h.recovers <= h.degrades <= checks.count(False)


async def _noop(_: str) -> None:
    return None


def bridge(count: int = 2, *, seen: float = 100.0, online: bool = True) -> BridgeConn:
    conn = BridgeConn("b", _noop, SlotLedger(count, count), online=online)
    conn.last_seen = seen
    return conn


def test_check_bridges_names_the_first_failing_condition() -> None:
    now, silence = 100.0, 60.0
    assert check_bridges([], now, silence) == "no bridge connected"
    assert check_bridges([bridge(online=False)], now, silence) == "no bridge connected"
    assert check_bridges([bridge(seen=30.0)], now, silence) == "no heartbeat within 60 s"
    assert check_bridges([bridge(count=0)], now, silence) == "no instances"
    out = bridge()
    out.set_state(quarantined_at=90.0)
    assert check_bridges([out], now, silence) == "every bridge is out of rotation"
    assert check_bridges([out, bridge(count=0), bridge(seen=90.0)], now, silence) == ""


def test_busy_bridges_are_still_healthy() -> None:
    busy = bridge()
    busy.report(2, 0)
    assert check_bridges([busy], 100.0, 60.0) == ""


def test_overflow_waits_for_the_delay_in_queue_order() -> None:
    assert overflow_ready([], 0.5) == 0
    assert overflow_ready([0.7, 0.6, 0.1, 0.9], 0.5) == 2
    assert overflow_ready([0.1, 0.9], 0.5) == 0
    assert overflow_ready([0.0, 0.0], 0.0) == 2  # no delay: the seed's behaviour


@given(st.lists(st.floats(0, 10), max_size=20), st.floats(0, 10))
def test_only_tasks_that_waited_long_enough_overflow(waited: list[float], after: float) -> None:
    ready = overflow_ready(waited, after)
    assert all(w >= after for w in waited[:ready])
    assert ready == len(waited) or waited[ready] < after
