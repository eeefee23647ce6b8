"""Who runs first, measured: a discrete-event simulation of a GPU fleet with paid overflow
(issue 27 item 5). Prints JSON.

    python bench/fleet_sim.py [--seed 27] [--hours 2] [--half-life 300] [--lookahead 256]

A simulated clock drives the dispatch policies over a workload generated from the seed:
AIGC projects and their users submitting at different rates, bursts, one user's flood,
workflows with run-time distributions and a model-load cost when a GPU switches
workflow, and a paid platform with a cap per project account and a price per workflow.
Two policies, imported, not copied:

* ``today``: :func:`aigcq.scheduler.routing.share_round_robin` over the projects' queues,
  first come first served inside each, and :func:`aigcq.scheduler.routing.plan` per queue:
  whatever finds no free GPU overflows to the paid platform while it has room;
* ``fair``: :func:`aigcq.scheduler.policy.plan_round`, fed what a dispatch round of
  :mod:`aigcq.scheduler.dispatch` knows (each queue's first ``--lookahead`` tasks, free and
  busy slot counts, the workflows' recent mean run times, decayed usage charged at each
  grant), and the sweep's expiry of a task past its start deadline.

A round runs after every event (a submit, a GPU or paid task ending) and once a second
(the sweep), as the dispatch loop does. For each policy and scenario: GPU utilisation
while work that could run was waiting, paid tasks and spend, start-deadline misses (late
starts, and expired tasks), p50/p99 wait per project and per user, and Jain's fairness
index of GPU-seconds across the equal-weight projects during a flood: each project's
GPU-seconds over its max-min fair share of what the fleet ran (its own GPU demand, capped
at an equal split of the rest). ``targets`` checks issue 27's three.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from aigcq.scheduler.policy import (
    Pool,
    Queue,
    Shares,
    Tuning,
    Waiting,
    decayed,
    next_mean,
    plan_round,
    time_left,
)
from aigcq.scheduler.routing import plan, share_round_robin

PLATFORM = "comfyui"
BATCH = 256  # aigcq.scheduler.dispatch.BATCH
SWEEP_S = 1.0  # AIGCQ_SWEEP_INTERVAL_S


# ---- the workload ---------------------------------------------------------------------


@dataclass(frozen=True)
class Workflow:
    name: str
    mean_s: float  # lognormal run time on one of our GPUs
    sigma: float
    price: float  # on the paid platform, per task

    def sample(self, rng: random.Random) -> float:
        mu = math.log(self.mean_s) - self.sigma**2 / 2
        return rng.lognormvariate(mu, self.sigma)


WORKFLOWS = {
    w.name: w
    for w in (
        Workflow("t2i", 6.0, 0.35, 0.10),
        Workflow("upscale", 14.0, 0.3, 0.25),
        Workflow("video", 40.0, 0.4, 1.20),
    )
}
MODEL_LOAD_S = 4.0  # a GPU that switches workflow loads its checkpoint first
PAID_LATENCY_S = 1.5  # a paid create until the task starts there
PAID_SLOWER = 1.2  # paid run time / ours


@dataclass(frozen=True)
class Project:
    name: str
    users: int
    rate_per_s: float
    mix: dict[str, float]
    max_wait_s: float
    paid_cap: int = 4
    #: a burst of this many tasks by its first user every ``burst_every_s``
    burst: int = 0
    burst_every_s: float = 600.0


PROJECTS = (
    Project("shop", 5, 0.30, {"t2i": 0.8, "upscale": 0.2}, 60.0),
    Project("avatar", 3, 0.12, {"video": 0.6, "t2i": 0.4}, 300.0),
    # its account is sized for its bursts: a fair share of the fleet and 8 paid at once
    # start 60 tasks within its 30 s (the ``bursts_tight`` scenario gives it 4)
    Project("poster", 4, 0.22, {"t2i": 0.6, "upscale": 0.4}, 30.0, paid_cap=8, burst=60),
    Project("game", 2, 0.10, {"upscale": 0.5, "video": 0.5}, 120.0),
)


@dataclass(frozen=True)
class Flood:
    """One user of one project submits ``tasks`` evenly over [start, start + over_s)."""

    project: str
    tasks: int
    start_s: float
    over_s: float


@dataclass(frozen=True)
class Scenario:
    name: str
    gpus: int
    hours: float
    flood: Flood | None = None
    #: project -> its paid account's cap, instead of its own
    paid_caps: dict[str, int] = field(default_factory=dict)


@dataclass
class Task:
    id: str
    project: str
    user: str
    workflow: str
    created: float
    run_s: float  # on our GPUs, without a model load
    start_by: float
    start: float | None = None
    where: str = ""  # gpu | paid | expired
    gpu_s: float = 0.0  # GPU time it held (run + model load)
    ended: float = 0.0

    @property
    def queue(self) -> Queue:
        return (self.project, PLATFORM)


def workload(scenario: Scenario, seed: int) -> list[Task]:
    """Every task of the scenario, by submit time: Poisson arrivals per project with its
    users picked at random, its bursts, and the flood."""
    rng = random.Random(seed)
    horizon = scenario.hours * 3600
    tasks: list[Task] = []

    def add(p: Project, user: str, at: float) -> None:
        names, weights = zip(*p.mix.items(), strict=True)
        wf = rng.choices(names, weights)[0]
        tasks.append(
            Task(f"{p.name}-{len(tasks)}", p.name, user, wf, at,
                 WORKFLOWS[wf].sample(rng), at + p.max_wait_s)
        )  # fmt: skip

    for p in PROJECTS:
        t = rng.expovariate(p.rate_per_s)
        while t < horizon:
            add(p, f"{p.name}-u{rng.randrange(p.users)}", t)
            t += rng.expovariate(p.rate_per_s)
        if p.burst:
            for start in itertools.count(p.burst_every_s / 2, p.burst_every_s):
                if start >= horizon:
                    break
                for _ in range(p.burst):
                    add(p, f"{p.name}-u0", start + rng.uniform(0, 10))
    if scenario.flood is not None:
        f = scenario.flood
        project = next(p for p in PROJECTS if p.name == f.project)
        for i in range(f.tasks):
            add(project, f"{f.project}-flooder", f.start_s + i * f.over_s / f.tasks)
    tasks.sort(key=lambda t: t.created)
    return tasks


# ---- the fleet ------------------------------------------------------------------------


@dataclass
class Gpu:
    task: Task | None = None
    last_workflow: str = ""


@dataclass
class Fleet:
    """The simulated fleet: queues, GPUs, the paid accounts, and what was measured."""

    scenario: Scenario
    tasks: list[Task] = field(default_factory=list)
    now: float = 0.0
    queues: dict[Queue, list[Task]] = field(default_factory=lambda: defaultdict(list))
    gpus: list[Gpu] = field(default_factory=list)
    paid_running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    events: list[tuple[float, int, str, Any]] = field(default_factory=list)
    seq: Iterator[int] = field(default_factory=itertools.count)
    # what the rounds know: the workflows' recent means; decayed usage, charged at grants
    means: dict[str, tuple[float, int]] = field(default_factory=dict)
    usage: dict[str, tuple[float, float]] = field(default_factory=dict)
    user_usage: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # measured
    waiting_gpu_s: float = 0.0  # ∫ GPUs over time while a task waited
    busy_while_waiting_s: float = 0.0  # ∫ busy GPUs over the same time
    last_t: float = 0.0

    def __post_init__(self) -> None:
        self.gpus = [Gpu() for _ in range(self.scenario.gpus)]

    def at(self, t: float, kind: str, what: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, what))

    def advance(self, t: float) -> None:
        """Integrate utilisation over [last event, t): while anything waits."""
        dt = t - self.last_t
        if dt > 0 and any(self.queues.values()):
            self.waiting_gpu_s += dt * len(self.gpus)
            self.busy_while_waiting_s += dt * sum(g.task is not None for g in self.gpus)
        self.last_t = self.now = t

    def idle(self) -> list[Gpu]:
        return [g for g in self.gpus if g.task is None]

    def run_on_gpu(self, task: Task, gpu: Gpu) -> None:
        load = MODEL_LOAD_S if gpu.last_workflow != task.workflow else 0.0
        gpu.task, gpu.last_workflow = task, task.workflow
        task.start, task.where, task.gpu_s = self.now, "gpu", task.run_s + load
        self.at(self.now + task.gpu_s, "gpu_end", gpu)

    def run_paid(self, task: Task) -> None:
        """A paid create now: its start, as the start deadline counts it (the platform
        runs it after ``PAID_LATENCY_S``)."""
        self.paid_running[task.project] += 1
        task.start, task.where = self.now, "paid"
        self.at(self.now + PAID_LATENCY_S + task.run_s * PAID_SLOWER, "paid_end", task)

    def take(self, queue: Queue, ids: list[str]) -> list[Task]:
        """Remove ``ids`` from ``queue`` (the claim by ids), in that order."""
        wanted = set(ids)
        line = self.queues[queue]
        taken = {t.id: t for t in line if t.id in wanted}
        self.queues[queue] = [t for t in line if t.id not in wanted]
        return [taken[i] for i in ids]

    def paid_room(self, project: str) -> int:
        cap = next(p.paid_cap for p in PROJECTS if p.name == project)
        return self.scenario.paid_caps.get(project, cap) - self.paid_running[project]

    def mean_run(self, workflow: str) -> float:
        """The workflow's recent mean run time; before its first run, the others' mean."""
        if workflow in self.means:
            return self.means[workflow][0]
        known = [m for m, _ in self.means.values()]
        return statistics.fmean(known) if known else 10.0

    def recorded_run(self, task: Task) -> None:
        mean, count = self.means.get(task.workflow, (0.0, 0))
        self.means[task.workflow] = next_mean(mean, count, task.gpu_s)


Policy = Callable[[Fleet], None]


def today(fleet: Fleet) -> Policy:
    rr = itertools.count()

    def round_(f: Fleet) -> None:
        queues = sorted(f.queues)
        demands = [min(len(f.queues[q]), BATCH) for q in queues]
        idle = f.idle()
        shares = share_round_robin(demands, len(idle), next(rr))
        for q, share, demand in zip(queues, shares, demands, strict=True):
            split = plan(demand, share, max(f.paid_room(q[0]), 0))
            line = f.queues[q]
            for task in line[: split.internal]:
                f.run_on_gpu(task, idle.pop())
            for task in line[split.internal : split.internal + split.external]:
                f.run_paid(task)
            del line[: split.internal + split.external]

    return round_


def fair(half_life_s: float, lookahead: int, tuning: Tuning) -> Callable[[Fleet], Policy]:
    def make(fleet: Fleet) -> Policy:
        def round_(f: Fleet) -> None:
            window = [
                Waiting(t.id, q, t.created, f.mean_run(t.workflow), user=t.user,
                        start_by=t.start_by)
                for q, line in f.queues.items()
                for t in line[:lookahead]
            ]  # fmt: skip
            if not window:
                return
            idle = f.idle()
            busy = [
                time_left(f.mean_run(g.task.workflow), f.now - (g.task.start or f.now))
                for g in f.gpus
                if g.task is not None
            ]
            pool = Pool(len(idle), 0, busy)
            shares = Shares(
                usage={p: decayed(v, f.now - t, half_life_s) for p, (v, t) in f.usage.items()},
                user_usage={
                    u: decayed(v, f.now - t, half_life_s) for u, (v, t) in f.user_usage.items()
                },
            )
            rooms = {q: max(f.paid_room(q[0]), 0) for q in f.queues}
            d = plan_round(window, pool, shares, rooms, f.now, tuning)
            for q, ids in d.internal.items():
                for task in f.take(q, ids):
                    f.run_on_gpu(task, idle.pop())
            for q, ids in d.paid.items():
                for task in f.take(q, ids):
                    f.run_paid(task)
            expire(f, set(d.expired))
            for p, gpu_s in d.charged.items():
                f.usage[p] = (charge(f.usage.get(p), gpu_s, f.now, half_life_s), f.now)
            for u, gpu_s in d.charged_users.items():
                f.user_usage[u] = (charge(f.user_usage.get(u), gpu_s, f.now, half_life_s), f.now)

        return round_

    return make


def charge(before: tuple[float, float] | None, add: float, now: float, half_life_s: float) -> float:
    """Decayed usage plus a grant (what :mod:`aigcq.scheduler.usage` records in Redis)."""
    if before is None:
        return add
    value, at = before
    return decayed(value, now - at, half_life_s) + add


def expire(f: Fleet, ids: set[str]) -> None:
    for q, line in f.queues.items():
        for task in line:
            if task.id in ids:
                task.where = "expired"
        f.queues[q] = [t for t in line if t.id not in ids]


def sweep_expired(f: Fleet) -> None:
    """The sweep: tasks anywhere in a queue past their start deadline end TaskExpired."""
    expire(f, {t.id for line in f.queues.values() for t in line if t.start_by <= f.now})


def simulate(
    scenario: Scenario, seed: int, make: Callable[[Fleet], Policy], expires: bool
) -> Fleet:
    f = Fleet(scenario)
    policy = make(f)
    tasks = workload(scenario, seed)
    for task in tasks:
        f.at(task.created, "submit", task)
    horizon = scenario.hours * 3600
    for tick in range(1, int(horizon / SWEEP_S) + 1):
        f.at(tick * SWEEP_S, "sweep")
    f.tasks = tasks
    while f.events:
        t = f.events[0][0]
        f.advance(t)
        while f.events and f.events[0][0] == t:
            _, _, kind, what = heapq.heappop(f.events)
            if kind == "submit":
                f.queues[what.queue].append(what)
            elif kind == "gpu_end":
                f.recorded_run(what.task)
                what.task.ended, what.task = t, None
            elif kind == "paid_end":
                f.paid_running[what.project] -= 1
                what.ended = t
            elif kind == "sweep" and expires:
                sweep_expired(f)
        policy(f)
    return f


# ---- the figures ----------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 2)


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one has everything."""
    if not xs or not any(xs):
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def max_min_shares(demands: dict[str, float], total: float) -> dict[str, float]:
    """Max-min fair split of ``total`` over equal-weight ``demands`` (water-filling)."""
    shares, left, open_ = {}, total, dict(demands)
    while open_:
        even = left / len(open_)
        small = {k: d for k, d in open_.items() if d <= even}
        if not small:
            shares.update({k: even for k in open_})
            break
        for k, d in small.items():
            shares[k] = d
            left -= d
            del open_[k]
    return shares


def gpu_s_within(task: Task, start: float, end: float) -> float:
    if task.where != "gpu" or task.start is None:
        return 0.0
    return max(0.0, min(task.start + task.gpu_s, end) - max(task.start, start))


def figures(f: Fleet, window: tuple[float, float] | None) -> dict[str, Any]:
    tasks = f.tasks
    started = [t for t in tasks if t.start is not None]
    waits: dict[str, list[float]] = defaultdict(list)
    user_waits: dict[str, list[float]] = defaultdict(list)
    for t in started:
        assert t.start is not None
        waits[t.project].append(t.start - t.created)
        user_waits[t.user].append(t.start - t.created)
    paid = [t for t in tasks if t.where == "paid"]
    late = sum(1 for t in started if t.start is not None and t.start > t.start_by)
    expired = sum(1 for t in tasks if t.where == "expired")
    out: dict[str, Any] = {
        "tasks": len(tasks),
        "gpu_utilisation_while_waiting": round(f.busy_while_waiting_s / f.waiting_gpu_s, 4)
        if f.waiting_gpu_s
        else 1.0,
        "paid_tasks": len(paid),
        "spend": round(sum(WORKFLOWS[t.workflow].price for t in paid), 2),
        "deadline_misses": late + expired,
        "late_starts": late,
        "expired": expired,
        "never_started": sum(1 for t in tasks if t.where == ""),
        "by_project": {
            p: {
                "paid": sum(1 for t in mine if t.where == "paid"),
                "late": sum(1 for t in mine if t.start is not None and t.start > t.start_by),
                "expired": sum(1 for t in mine if t.where == "expired"),
            }
            for p in sorted({t.project for t in tasks})
            for mine in [[t for t in tasks if t.project == p]]
        },
        "wait_s": {p: {"p50": pct(w, 0.5), "p99": pct(w, 0.99)} for p, w in sorted(waits.items())},
        "wait_s_by_user": {
            u: {"p50": pct(w, 0.5), "p99": pct(w, 0.99)} for u, w in sorted(user_waits.items())
        },
    }
    if window is not None:
        start, end = window
        demand: dict[str, float] = defaultdict(float)
        got: dict[str, float] = defaultdict(float)
        for t in tasks:
            got[t.project] += gpu_s_within(t, start, end)
            if start <= t.created < end and t.where != "paid":
                demand[t.project] += t.run_s
        fair_share = max_min_shares(dict(demand), sum(got.values()))
        ratio = {p: got[p] / fair_share[p] for p in fair_share if fair_share[p] > 0}
        out["flood_window_s"] = [start, end]
        out["gpu_s_in_window"] = {p: round(v) for p, v in sorted(got.items())}
        out["max_min_fair_gpu_s"] = {p: round(v) for p, v in sorted(fair_share.items())}
        out["jain_gpu_s"] = round(jain(list(ratio.values())), 4)
    return out


def scenarios(hours: float) -> dict[str, Scenario]:
    flood = Flood("shop", 3000, 1800.0, 1200.0)  # 2.5 tasks/s for 20 min, one user
    return {
        "bursts": Scenario("bursts", 16, hours),
        "bursts_tight": Scenario("bursts_tight", 16, hours, paid_caps={"poster": 4}),
        "flood": Scenario("flood", 16, hours, flood),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    tuning = Tuning(args.lend, args.patience, args.margin)
    policies = {
        "today": (today, False),
        "fair": (fair(args.half_life, args.lookahead, tuning), True),
    }
    report: dict[str, Any] = {"seed": args.seed, "hours": args.hours}
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for name, scenario in scenarios(args.hours).items():
        flood = scenario.flood
        window = None if flood is None else (flood.start_s, flood.start_s + flood.over_s)
        for policy, (make, expires) in policies.items():
            fleet = simulate(scenario, args.seed, make, expires)
            runs[(name, policy)] = figures(fleet, window)
            print(name, policy, "done", file=sys.stderr)
    report["scenarios"] = {
        name: {policy: runs[(name, policy)] for policy in policies}
        for name in scenarios(args.hours)
    }
    report["targets"] = targets(runs)
    report["sim_seconds"] = round(time.perf_counter() - started, 1)
    return report


def targets(runs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Issue 27's three targets: deadline-aware overflow pays for >= 30% fewer tasks than
    overflow-when-full with the same or fewer start-deadline misses (each burst
    scenario); under the flood Jain >= 0.95 and the other projects' p99 wait within 1.5x
    of theirs in ``bursts`` (its p99 floored at one sweep); utilisation >= 98% while
    work waits."""
    out: dict[str, Any] = {}
    for name in ("bursts", "bursts_tight"):
        today_b, fair_b = runs[(name, "today")], runs[(name, "fair")]
        fewer = 1 - fair_b["paid_tasks"] / today_b["paid_tasks"] if today_b["paid_tasks"] else 0.0
        out[name] = {
            "paid_fair_vs_today": [fair_b["paid_tasks"], today_b["paid_tasks"]],
            "paid_fewer_by": round(fewer, 3),
            "misses_fair_vs_today": [fair_b["deadline_misses"], today_b["deadline_misses"]],
            "met": fewer >= 0.30 and fair_b["deadline_misses"] <= today_b["deadline_misses"],
        }
    flood, calm = runs[("flood", "fair")], runs[("bursts", "fair")]
    p99_ratio = {
        p: round(flood["wait_s"][p]["p99"] / max(calm["wait_s"][p]["p99"], SWEEP_S), 2)
        for p in flood["wait_s"]
        if p != "shop"
    }
    out["flood"] = {
        "jain_gpu_s": flood["jain_gpu_s"],
        "others_p99_flood_over_calm": p99_ratio,
        "met": flood["jain_gpu_s"] >= 0.95 and all(r <= 1.5 for r in p99_ratio.values()),
    }
    utils = [r["gpu_utilisation_while_waiting"] for (_, pol), r in runs.items() if pol == "fair"]
    out["utilisation"] = {"min_while_waiting": min(utils), "met": min(utils) >= 0.98}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--half-life", type=float, default=300.0, help="usage half-life (s)")
    parser.add_argument("--lookahead", type=int, default=256, help="tasks read per queue")
    default = Tuning()
    parser.add_argument("--lend", type=float, default=default.lend_s, help="Tuning.lend_s")
    parser.add_argument("--patience", type=float, default=default.patience)
    parser.add_argument("--margin", type=float, default=default.margin)
    print(json.dumps(main(parser.parse_args()), indent=2))
