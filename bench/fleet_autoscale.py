"""Queue, rent or overflow, measured (issue 40 item 5): ``python bench/fleet_sim.py --autoscale``.

The fleet simulator's workloads (:mod:`bench.fleet_sim`: the same tasks, the same one
scheduler dispatching them, the same paid accounts with their caps and per-workflow
prices) on a fleet of :data:`OWNED` owned GPUs (price 0) plus a rentable pool
(:data:`RENT`: price per hour, billed by the minute, a boot time, at most ``max``), under
four capacity policies:

* ``static``: today's fleet, fixed: the owned GPUs and :data:`STATIC_RENTED` rented ones
  kept all the time (the scenario's 16 GPUs), overflow to paid as the scheduler decides.
* ``queue_depth``: an autoscaler as KEDA is usually configured: every
  :data:`KEDA_POLL_S`, desired = ceil(waiting ÷ :data:`TARGET_PER_INSTANCE`) rented
  instances (within ``max``); up at once, down after the HPA's 300 s stabilisation window
  (the highest desired count of the last 300 s), idle instances first.
* ``all_paid``: no rented GPU: the owned ones and the paid platforms.
* ``planner``: :func:`aigcq.scheduler.capacity.plan` every :data:`PLAN_S`, fed what the
  serve loop feeds it (the waiting tasks with their workflows' mean run times and start
  deadlines, the instances busy / idle / booting with their billing position, the paid
  accounts' price per task and room); its desired count is started, and the idle
  instances it names at the end of a billing step are stopped.

Per scenario, seed and policy: ``total_cost`` (paid spend + rented instances' billing:
each instance's whole billing steps from start to stop), ``paid_tasks``,
``instance_hours`` (rented, billed), ``deadline_misses`` (late starts and expired) and
``utilisation`` (GPU-seconds run ÷ GPU-seconds up, owned and rented).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import os
import statistics
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# this checkout's server and wire (domain's error codes), installed or not
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "aigcq-wire" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from bench.fleet_sim import (
    PAID_LATENCY_S,
    PAID_SLOWER,
    PROJECTS,
    SWEEP_S,
    WORKFLOWS,
    Fleet,
    Gpu,
    Scenario,
    _live,
    aigcq,
    event,
    late,
    workload,
)

from aigcq.config import BILLING_STEP_S
from aigcq.scheduler import capacity
from aigcq.scheduler.capacity import Arrival, InstanceView, Job, PaidSpec, PoolSpec
from aigcq.scheduler.policy import Tuning, time_left

OWNED = 8
STATIC_RENTED = 8


@dataclass(frozen=True)
class Rentable:
    price_per_hour: float = 1.5
    billing_step: str = "minute"
    boot_s: float = 90.0
    max: int = 24

    @property
    def step_s(self) -> int:
        return BILLING_STEP_S[self.billing_step]


RENT = Rentable()
KEDA_POLL_S = 15.0
TARGET_PER_INSTANCE = 4
STABILISE_S = 300.0
PLAN_S = 10.0
HORIZON_S = 900.0
#: the arrivals of the last this long are the forecast of the next (replayed)
RECENT_S = float(os.environ.get("FLEET_RECENT_S", 900.0))
#: capacity.Settings.deadline_margin: as long as the scheduler lets a task wait before it
#: pays for it (1 - its Tuning.margin)
DEADLINE_MARGIN = float(os.environ.get("FLEET_MARGIN", 1 - Tuning().margin))
#: a task with no start deadline is planned as if it had to start within this
PATIENCE_S = 300.0
POLICIES = ("static", "queue_depth", "all_paid", "planner")


@dataclass(eq=False)
class Rented(Gpu):
    since: float = 0.0


@dataclass
class Rent:
    """The rented pool of one run: the instances up, booting, and what they were billed."""

    spec: Rentable
    booting: list[float] = dataclasses.field(default_factory=list)  # ETAs
    billed: float = 0.0
    billed_s: float = 0.0

    def bill(self, gpu: Rented, now: float) -> None:
        step = self.spec.step_s
        seconds = max(math.ceil((now - gpu.since) / step), 1) * step
        self.billed_s += seconds
        self.billed += seconds * self.spec.price_per_hour / 3600


def rented(f: Fleet) -> list[Rented]:
    return [g for g in f.gpus if isinstance(g, Rented)]


def start(f: Fleet, rent: Rent, n: int) -> None:
    for _ in range(n):
        eta = f.now + rent.spec.boot_s
        rent.booting.append(eta)
        f.at(eta, "boot")


def stop(f: Fleet, rent: Rent, gpu: Rented) -> None:
    assert gpu.task is None
    rent.bill(gpu, f.now)
    f.gpus.remove(gpu)


Scaler = Callable[[Fleet, Rent], None]


def queue_depth() -> Scaler:
    history: deque[tuple[float, int]] = deque()

    def scale(f: Fleet, rent: Rent) -> None:
        waiting = sum(f.backlog.values())
        want = min(rent.spec.max, math.ceil(waiting / TARGET_PER_INSTANCE))
        history.append((f.now, want))
        while history and history[0][0] < f.now - STABILISE_S:
            history.popleft()
        current = len(rented(f)) + len(rent.booting)
        if want > current:
            start(f, rent, want - current)
            return
        keep = max(w for _, w in history)
        for gpu in [g for g in rented(f) if g.task is None][: max(current - keep, 0)]:
            stop(f, rent, gpu)

    return scale


def forecast(f: Fleet) -> list[Job]:
    """:func:`aigcq.scheduler.capacity.forecast` of the last :data:`RECENT_S` of submits."""
    now = f.now
    lo = bisect.bisect_left(f.created, now - RECENT_S)
    hi = bisect.bisect_left(f.created, now)
    arrivals = [
        Arrival(t.id, t.created, f.mean_run(t.workflow),
                t.start_by - t.created if t.start_by is not None else None,
                paid=t.project, price=WORKFLOWS[t.workflow].price)
        for t in f.tasks[lo:hi]
    ]  # fmt: skip
    return capacity.forecast(
        arrivals, now, recent_s=RECENT_S, horizon_s=HORIZON_S, patience_s=PATIENCE_S
    )


def planner(f: Fleet, rent: Rent) -> None:
    now = f.now
    jobs: list[Job] = []
    for q, line in f.lines.items():
        for t in itertools.islice(_live(line), 2000):
            if (t.project, t.workflow) in f.paused or f.limited(t.project, t.user):
                continue
            start_by = t.start_by - now if t.start_by is not None else PATIENCE_S + t.created - now
            jobs.append(
                Job(t.id, f.mean_run(t.workflow), max(start_by, 0.0), paid=q[0],
                    price=WORKFLOWS[t.workflow].price)
            )  # fmt: skip
    jobs += forecast(f)
    jobs.sort(key=lambda j: (j.arrive_s, j.start_by))
    fleet: list[InstanceView] = []
    for i, g in enumerate(f.gpus):
        busy = g.task is not None
        left = time_left(f.mean_run(g.task.workflow), now - (g.task.start or now)) if g.task else 0
        if isinstance(g, Rented):
            fleet.append(InstanceView(f"r{id(g)}", "rent", busy, left, billed_s=now - g.since))
        else:
            fleet.append(InstanceView(f"o{i}", "own", busy, left))
    fleet += [
        InstanceView(f"b{k}", "rent", boot_eta_s=max(eta - now, 0.0))
        for k, eta in enumerate(rent.booting)
    ]
    spec = rent.spec
    pools = {
        "own": PoolSpec("own", 0.0, 1, 0.0, OWNED, OWNED),
        "rent": PoolSpec("rent", spec.price_per_hour, spec.step_s, spec.boot_s, 0, spec.max),
    }
    paid = {}
    for p in PROJECTS:
        cap = f.scenario.paid_caps.get(p.name, p.paid_cap)
        running = f.paid_running[p.name]
        mean = statistics.fmean(WORKFLOWS[w].price for w in p.mix)
        run = sum(share * WORKFLOWS[w].mean_s for w, share in p.mix.items()) / sum(p.mix.values())
        paid[p.name] = PaidSpec(
            p.name, mean, cap, [PAID_LATENCY_S + 5.0] * running, PAID_LATENCY_S + run * PAID_SLOWER
        )
    settings = capacity.Settings(HORIZON_S, None, 2 * PLAN_S, DEADLINE_MARGIN)
    got = capacity.plan(jobs, fleet, pools, paid, settings)
    d = got.pools["rent"]
    current = len(rented(f)) + len(rent.booting)
    if d.desired > current:
        start(f, rent, d.desired - current)
    by_id = {f"r{id(g)}": g for g in rented(f)}
    for instance_id in d.stop:
        gpu = by_id.get(instance_id)
        if gpu is not None and gpu.task is None:
            stop(f, rent, gpu)


def simulate(scenario: Scenario, seed: int, policy: str) -> dict[str, Any]:
    """One run of ``scenario`` under a capacity ``policy``; its figures."""
    f = Fleet(dataclasses.replace(scenario, gpus=OWNED))
    dispatch = aigcq(Tuning())(f)
    rent = Rent(RENT)
    if policy == "static":
        f.gpus += [Rented() for _ in range(STATIC_RENTED)]
    scaler: Scaler | None = {
        "queue_depth": queue_depth(),
        "planner": planner,
    }.get(policy)
    tick = {"queue_depth": KEDA_POLL_S, "planner": PLAN_S}.get(policy, 0.0)
    tasks = workload(scenario, seed)
    for task in tasks:
        f.at(task.created, "submit", task)
    for pause in scenario.pauses:
        f.at(pause.start_s, "pause", (pause.project, pause.workflow))
        f.at(pause.end_s, "resume", (pause.project, pause.workflow))
    horizon = scenario.hours * 3600
    f.at(SWEEP_S, "sweep")
    if scaler is not None:
        f.at(tick, "scale")
    f.tasks = tasks
    f.created = [t.created for t in tasks]  # type: ignore[attr-defined]
    up_s, last = 0.0, 0.0
    while f.events:
        t = f.events[0][0]
        up_s += (t - last) * len(f.gpus)
        last = t
        f.advance(t)
        while f.events and f.events[0][0] == t:
            _, _, kind, what = heapq.heappop(f.events)
            more = t < horizon or (f.waiting and t < horizon + 86400)
            if kind == "boot":
                rent.booting.remove(t)
                f.gpus.append(Rented(since=t))
            elif kind == "scale":
                assert scaler is not None
                scaler(f, rent)
                if more or rented(f) or rent.booting:
                    f.at(t + tick, "scale")
            else:
                event(f, kind, what, True)
                if kind == "sweep" and more:
                    f.at(t + SWEEP_S, "sweep")
        dispatch(f)
    end = max(last, horizon)
    up_s += (end - last) * len(f.gpus)
    f.now = end
    for gpu in rented(f):
        gpu.task = None
        rent.bill(gpu, end)
    paid = [t for t in tasks if t.where == "paid"]
    spend = sum(WORKFLOWS[t.workflow].price for t in paid)
    run_s = sum(t.gpu_s for t in tasks if t.where == "gpu")
    return {
        "total_cost": round(spend + rent.billed, 2),
        "paid_tasks": len(paid),
        "paid_spend": round(spend, 2),
        "rent": round(rent.billed, 2),
        "instance_hours": round(rent.billed_s / 3600, 2),
        "deadline_misses": sum(1 for t in tasks if late(t) or t.where == "expired"),
        "utilisation": round(run_s / up_s, 4) if up_s else 0.0,
        "never_started": sum(1 for t in tasks if t.where == ""),
        "paid_by_project": {p.name: sum(1 for t in paid if t.project == p.name) for p in PROJECTS},
        "misses_by_project": {
            p.name: sum(
                1 for t in tasks if t.project == p.name and (late(t) or t.where == "expired")
            )
            for p in PROJECTS
        },
    }


def autoscale(
    chosen: dict[str, Scenario], seeds: list[int], log: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """``{"autoscale": {SCENARIO: {SEED: {POLICY: figures}}}, "targets": …}``."""
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for name, scenario in chosen.items():
        for seed in seeds:
            for policy in POLICIES:
                runs.setdefault(name, {}).setdefault(str(seed), {})[policy] = simulate(
                    scenario, seed, policy
                )
                log(f"{name} {seed} {policy} done")
    return {"autoscale": runs, "targets": targets(runs), "rentable": dataclasses.asdict(RENT),
            "owned": OWNED, "static_rented": STATIC_RENTED}  # fmt: skip


def targets(runs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Issue 40's: the planner's total cost <= 0.8x the cheapest other policy's, with no
    more deadline misses than that policy."""
    out: dict[str, Any] = {}
    for name, by_seed in runs.items():
        for seed, r in by_seed.items():
            others = {p: v for p, v in r.items() if p != "planner"}
            cheapest = min(others, key=lambda p: others[p]["total_cost"])
            c, mine = others[cheapest], r["planner"]
            ratio = mine["total_cost"] / c["total_cost"] if c["total_cost"] else math.inf
            out.setdefault(name, {})[seed] = {
                "cheapest_other": cheapest,
                "cost_ratio": round(ratio, 3),
                "misses_planner_vs_it": [mine["deadline_misses"], c["deadline_misses"]],
                "met": ratio <= 0.8 and mine["deadline_misses"] <= c["deadline_misses"],
            }
    return out
