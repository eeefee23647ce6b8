"""``python bench/fleet_sim.py --autoscale`` (issue 40 item 5): the shape it prints, and a
short run of every capacity policy that accounts for every task and bills what it rents."""

from __future__ import annotations

from bench.fleet_autoscale import POLICIES, simulate
from bench.fleet_sim import main, scenarios


def test_a_short_run_of_each_policy_accounts_for_every_task() -> None:
    scenario = scenarios(0.05, 0.05)["bursts"]
    for policy in POLICIES:
        out = simulate(scenario, 1, policy)
        assert out["never_started"] == 0
        assert 0.0 <= out["utilisation"] <= 1.0
        assert out["total_cost"] >= out["paid_spend"]
        if policy == "all_paid":
            assert out["instance_hours"] == 0 and out["rent"] == 0
        if policy == "static":
            assert out["instance_hours"] >= 8 * 0.05


def test_the_autoscale_table_has_the_issues_shape() -> None:
    got = main(["--autoscale", "--smoke", "--workloads", "bursts", "flood"])
    assert set(got["autoscale"]) == {"bursts", "flood"}
    for by_seed in got["autoscale"].values():
        for by_policy in by_seed.values():
            assert set(by_policy) == set(POLICIES)
            for row in by_policy.values():
                assert {"total_cost", "paid_tasks", "instance_hours", "deadline_misses",
                        "utilisation"} <= set(row)  # fmt: skip
    assert set(got["targets"]["bursts"]["27"]) >= {"cheapest_other", "cost_ratio", "met"}
