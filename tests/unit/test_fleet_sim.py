"""The fleet simulator's own arithmetic (bench/fleet_sim.py, issue 27 item 5, issue 37):
Jain's index, max-min fair shares, a short run of every workload that accounts for every
task, and the ``--smoke`` run's table and targets."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from bench.fleet_sim import (
    WORKLOADS,
    Fleet,
    Policy,
    Scenario,
    Share,
    aigcq,
    figures,
    jain,
    main,
    max_min_shares,
    scenarios,
    simulate,
    today,
)
from hypothesis import given
from hypothesis import strategies as st

from aigcq.scheduler.policy import Tuning


def test_jain_is_one_when_equal_and_one_over_n_when_one_has_everything() -> None:
    assert jain([3.0, 3.0, 3.0]) == 1.0
    assert jain([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)


def test_max_min_shares_fill_the_small_demands_first() -> None:
    assert max_min_shares({"a": 1.0, "b": 10.0, "c": 10.0}, 9.0) == {"a": 1.0, "b": 4.0, "c": 4.0}


@given(st.dictionaries(st.sampled_from("abcde"), st.floats(0, 100), min_size=1), st.floats(0, 300))
def test_max_min_shares_never_exceed_a_demand_nor_the_total(
    demands: dict[str, float], total: float
) -> None:
    shares = max_min_shares(demands, total)
    assert all(shares[k] <= demands[k] + 1e-9 or shares[k] == max(shares.values()) for k in shares)
    assert sum(shares.values()) == pytest.approx(min(total, sum(demands.values())), abs=1e-6)


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize(
    ("make", "expires"), [(today, True), (aigcq(Tuning()), True)], ids=["today", "aigcq"]
)
def test_a_short_run_accounts_for_every_task(
    workload: str, make: Callable[[Fleet], Policy], expires: bool
) -> None:
    fleet = simulate(scenarios(0.05, 0.05)[workload], 1, make, expires)
    out = figures(fleet, None)
    assert out["never_started"] == 0  # each ran, was paid for, or expired
    assert out["tasks"] == len(fleet.tasks) > 0
    assert 0.0 <= out["gpu_utilisation_while_waiting"] <= 1.0
    assert 0.0 <= out["gpu_utilisation_while_runnable"] <= 1.0
    assert out["expired"] == 0 or expires
    assert not fleet.waiting and all(g.task is None for g in fleet.gpus)
    assert all(n == 0 for n in fleet.user_running.values())
    if make is not today:  # the limit holds at every moment (the old fifo did not check it)
        assert out["user_limit_excess"] == 0


def test_a_project_max_holds_at_every_moment_and_its_min_is_served() -> None:
    shares = {"poster": Share(min=2, max=3, weight=2.0), "avatar": Share(max=1)}
    fleet = simulate(Scenario("shares", 6, 0.05, shares=shares), 2, aigcq(Tuning()), True)
    out = figures(fleet, None)
    assert out["project_max_excess"] == 0 and out["never_started"] == 0
    assert fleet.most_running["poster"] <= 3 and fleet.most_running["avatar"] <= 1
    assert fleet.most_running["shop"] > 3  # the others are not held


def test_the_smoke_run_tables_every_workload_and_checks_the_targets() -> None:
    report = main(["--smoke"])
    assert set(report["table"]) == set(WORKLOADS) == set(report["targets"])
    for workload, by_seed in report["table"].items():
        for seed, row in by_seed.items():
            assert set(row) == {"today", "aigcq"}
            assert row["aigcq"]["user_limit_excess"] == 0
            assert ("jain" in row["aigcq"]) == (workload == "flood")
            target = report["targets"][workload][seed]
            assert target["met"] == all(
                v for k, v in target.items() if isinstance(v, bool) and k != "met"
            )
    assert report["table"]["user_limits"][str(report["seeds"][0])]["today"]["user_limit_excess"] > 0
