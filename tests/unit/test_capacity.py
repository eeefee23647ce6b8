"""The capacity planner (issue 40): pools.json; queue, rent or overflow over a horizon."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aigcq.config import ConfigError, load_pools
from aigcq.scheduler.capacity import (
    Arrival,
    InstanceView,
    Job,
    PaidSpec,
    PoolSpec,
    Settings,
    all_paid_bill,
    forecast,
    plan,
)

OWN = PoolSpec("own", 0.0, 1, 0, 2, 2)
A10 = PoolSpec("a10", 1.2, 60, 120, 0, 8)
RH = {"rh": PaidSpec("rh", 0.1, 4)}


def jobs(n: int, run_s: float = 20, start_by: float = 600) -> list[Job]:
    return [Job(f"t{i}", run_s, start_by=start_by, paid="rh") for i in range(n)]


def busy_own() -> list[InstanceView]:
    return [InstanceView(f"o{i}", "own", busy=True, busy_left_s=30) for i in range(2)]


# ---- pools.json ------------------------------------------------------------------------


def write(tmp_path: Path, data: object) -> Path:
    (tmp_path / "pools.json").write_text(json.dumps(data))
    return tmp_path


def test_pools_load_with_defaults(tmp_path: Path) -> None:
    pools = load_pools(
        write(
            tmp_path,
            {
                "own": {"price_per_hour": 0, "min": 2, "max": 2},
                "a10": {"price_per_hour": 1.2, "billing_step": "minute", "boot_s": 120,
                        "max": 8, "node_classes": ["KSampler"], "models": ["sdxl.safetensors"]},
            },
        )
    )  # fmt: skip
    assert pools["a10"].step_s == 60 and pools["a10"].bridges == "a10-*"
    assert pools["own"].min == pools["own"].max == 2
    assert load_pools(tmp_path / "nowhere") == {}


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"max": 2, "mx": 3}, "field 'p.mx': Extra inputs are not permitted; did you mean 'max'?"),
        ({"price_per_hour": 1, "min": 3, "max": 2}, "max (2) is below min (3)"),
        ({"price_per_hour": 0, "min": 1, "max": 2}, "min (1) must equal max (2)"),
        ({"price_per_hour": 1, "max": 2, "billing_step": "day"}, "field 'p.billing_step'"),
        ({"price_per_hour": -1, "max": 2}, "field 'p.price_per_hour'"),
        ({"price_per_hour": 1}, "field 'p.max': Field required"),
    ],
)
def test_a_bad_pool_names_the_field(tmp_path: Path, entry: object, says: str) -> None:
    with pytest.raises(ConfigError, match=r"pools\.json") as got:
        load_pools(write(tmp_path, {"p": entry}))
    assert says in str(got.value)


# ---- the planner -----------------------------------------------------------------------


def test_a_flood_within_deadlines_rents_instead_of_overflowing() -> None:
    got = plan(jobs(200), busy_own(), {"own": OWN, "a10": A10}, RH)
    a10 = got.pools["a10"]
    assert a10.desired > 0 and a10.reason.startswith("rent")
    assert got.chosen.cost < got.queue.cost < got.all_paid.cost
    assert a10.spend["plan"] == pytest.approx(got.chosen.cost, abs=1e-3)
    assert got.pools["own"].desired == 2 and got.pools["own"].reason == "owned: fixed size"


def test_work_that_ends_before_the_boot_rents_nothing() -> None:
    # 4 tasks of 10 s: the owned pair finishes them long before an a10 would boot (120 s)
    got = plan(jobs(4, run_s=10, start_by=100), busy_own(), {"own": OWN, "a10": A10}, RH)
    assert got.pools["a10"].desired == 0
    assert got.chosen.paid_tasks == 0


def test_deadlines_before_the_boot_overflow_and_rent_nothing() -> None:
    got = plan(jobs(30, run_s=60, start_by=30), busy_own(), {"own": OWN, "a10": A10}, RH)
    assert got.pools["a10"].desired == 0
    assert got.chosen.paid_tasks > 0


def test_a_booting_instance_is_capacity_in_the_eta() -> None:
    booting = [InstanceView(f"b{i}", "a10", boot_eta_s=60) for i in range(8)]
    got = plan(jobs(40, run_s=20, start_by=300), [*busy_own(), *booting],
               {"own": OWN, "a10": A10}, RH)  # fmt: skip
    assert got.chosen.paid_tasks == 0 and got.chosen.misses == 0
    assert got.pools["a10"].desired == 8 and got.pools["a10"].booting == 8


def test_scale_in_only_idle_instances_whose_step_ends() -> None:
    fleet = [
        InstanceView("busy", "a10", busy=True, busy_left_s=10, billed_s=59),
        InstanceView("mid-step", "a10", billed_s=20),  # 40 s left of its paid minute
        InstanceView("ending", "a10", billed_s=55),  # 5 s left
    ]
    got = plan([], fleet, {"a10": A10}, RH)
    assert got.pools["a10"].stop == ("ending",)
    assert got.pools["a10"].desired == 2


def test_hourly_billing_keeps_an_idle_instance_until_its_hour_ends() -> None:
    hourly = PoolSpec("h100", 3.0, 3600, 300, 0, 4)
    fleet = [InstanceView("i1", "h100", billed_s=1200)]
    assert plan([], fleet, {"h100": hourly}, RH).pools["h100"].stop == ()
    fleet = [InstanceView("i1", "h100", billed_s=3590)]
    assert plan([], fleet, {"h100": hourly}, RH).pools["h100"].stop == ("i1",)


def test_min_is_kept_and_max_is_never_passed() -> None:
    pool = PoolSpec("a10", 1.2, 60, 120, 2, 3)
    got = plan(jobs(500), [], {"a10": pool}, RH)
    assert got.pools["a10"].desired == 3
    got = plan([], [], {"a10": pool}, RH)
    assert got.pools["a10"].desired == 2 and "below min" in got.pools["a10"].reason


def test_node_classes_decide_which_pool_rents() -> None:
    sdxl = PoolSpec("sdxl", 1.0, 60, 60, 0, 4, frozenset({"KSampler", "sdxl"}))
    flux = PoolSpec("flux", 2.0, 60, 60, 0, 4, frozenset({"KSampler", "flux"}))
    work = [Job(f"f{i}", 30, 600, frozenset({"flux"}), "rh") for i in range(60)]
    got = plan(work, [], {"sdxl": sdxl, "flux": flux}, RH)
    assert got.pools["sdxl"].desired == 0 and got.pools["flux"].desired > 0


def test_draining_idle_instances_are_named_for_stop() -> None:
    fleet = [InstanceView("d1", "a10", draining=True, billed_s=10)]
    got = plan([], fleet, {"a10": A10}, RH)
    assert got.pools["a10"].stop == ("d1",) and got.pools["a10"].desired == 0


def test_the_forecast_replays_the_recent_past_from_its_busiest_minute() -> None:
    now = 10_000.0
    steady = [Arrival(f"s{i}", now - 800 + 20 * i, 10, 60, paid="rh") for i in range(40)]
    burst = [Arrival(f"b{i}", now - 300 + 0.1 * i, 10, 30, paid="rh") for i in range(30)]
    got = forecast(steady + burst, now, recent_s=900, horizon_s=900, patience_s=300)
    assert len(got) == 70 and got == sorted(got, key=lambda j: j.arrive_s)
    first = [j for j in got if j.task_id.startswith("b")]  # the burst comes first, now
    assert all(j.arrive_s < 5 and j.start_by == pytest.approx(j.arrive_s + 30) for j in first)
    assert forecast(burst, now + 1000, recent_s=900, horizon_s=900, patience_s=300) == []
    # work that arrives only later: a flood forecast for the horizon rents ahead of it
    flood = [Arrival(f"f{i}", now - 600 + i, 20, 120, paid="rh") for i in range(300)]
    ahead = forecast(flood, now, recent_s=900, horizon_s=900, patience_s=300)
    assert plan(ahead, busy_own(), {"own": OWN, "a10": A10}, RH).pools["a10"].desired > 0


# ---- properties ------------------------------------------------------------------------

pools_st = st.builds(
    lambda price, step, boot, lo, extra: PoolSpec(
        "p", price, step, boot, lo if price else lo + extra, lo + extra
    ),
    st.sampled_from([0.0, 0.5, 2.0, 8.0]),
    st.sampled_from([1, 60, 3600]),
    st.sampled_from([0.0, 30.0, 120.0, 600.0]),
    st.integers(0, 3),
    st.integers(0, 5),
)
instance_st = st.builds(
    InstanceView,
    instance_id=st.uuids().map(str),
    pool=st.just("p"),
    busy=st.booleans(),
    busy_left_s=st.floats(0, 600),
    boot_eta_s=st.none() | st.floats(0, 300),
    billed_s=st.floats(0, 7200),
    draining=st.booleans(),
)
job_st = st.builds(
    Job,
    task_id=st.just("t"),
    run_s=st.floats(1, 300),
    start_by=st.sampled_from([math.inf, 0.0, 30.0, 300.0, 1200.0]) | st.floats(0, 1200),
    paid=st.sampled_from(["rh", ""]),
    arrive_s=st.just(0.0) | st.floats(0, 900),
)
paid_st = st.builds(
    lambda price, cap: {"rh": PaidSpec("rh", price, cap)},
    st.sampled_from([0.01, 0.1, 1.0]),
    st.integers(0, 8),
)


@settings(max_examples=150, deadline=None)
# a deadline after the horizon is at risk only after it: no miss in any fleet's bill
@example(
    pool=PoolSpec("p", 0.5, 1, 0.0, 1, 1),
    fleet=[],
    work=[
        Job("t", 1.0, math.inf, paid="rh"),
        Job("t", 1.0, math.inf, paid="rh"),
        Job("t", 189.0, math.inf, paid="rh", arrive_s=532.0),
        Job("t", 1.0, 901.0, paid="rh"),
    ],
    paid={"rh": PaidSpec("rh", 0.01, 0)},
)
@given(
    pool=pools_st,
    fleet=st.lists(instance_st, max_size=8),
    work=st.lists(job_st, max_size=60),
    paid=paid_st,
)
def test_plan_properties(
    pool: PoolSpec, fleet: list[InstanceView], work: list[Job], paid: dict[str, PaidSpec]
) -> None:
    fleet = fleet[: pool.max] if pool.price_per_hour else []
    got = plan(work, fleet, {"p": pool}, paid, Settings(horizon_s=900))
    d = got.pools["p"]
    assert pool.min <= d.desired <= pool.max
    stopped = set(d.stop)
    for inst in fleet:
        if inst.instance_id in stopped:
            assert not inst.busy and not inst.booting
    bill = all_paid_bill(work, paid, Settings(horizon_s=900))
    assert got.all_paid.cost >= bill.cost  # plus only what min forces
    assert got.chosen.cost <= got.all_paid.cost + 1e-9
    if pool.min == 0 or pool.price_per_hour == 0:
        assert got.chosen.cost <= bill.cost + 1e-9
    assert got.chosen.cost <= got.queue.cost + 1e-9
