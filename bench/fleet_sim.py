"""Who runs first, measured: a discrete-event simulation of a GPU fleet with paid overflow
(issue 27 item 5, issue 37 "How it is checked"). Prints JSON.

    python bench/fleet_sim.py [--seeds 27 28 29] [--hours 2] [--long-hours 4]
                              [--workloads bursts flood ...] [--smoke] [--autoscale]

(``--autoscale``: issue 40's capacity policies, bench/fleet_autoscale.py.)

A simulated clock drives two dispatch policies over workloads generated from each seed:
AIGC projects and their users submitting at different rates, bursts, one user's flood,
batches without start deadlines, workflow pauses, a per-user limit, workflows with
run-time distributions and a model-load cost when a GPU switches workflow, and a paid
platform with a cap per project account and a price per workflow. Policy code is
imported, never copied:

* ``today``: the old ``fifo`` dispatch path (before issue 37, main 48226d9), the baseline:
  :func:`aigcq.scheduler.routing.share_round_robin` over the configured queues (two turns
  of its round robin a round, as the old loop's two ``_internal_shares`` calls took) and
  :func:`aigcq.scheduler.routing.plan` per queue, first come first served from each
  queue's head (whatever finds no free GPU overflows to the paid platform while it has
  room). With a workflow paused it passes over the paused tasks, but only among the first
  ``BATCH`` + ``PASS_OVER`` (256 + 1,000) tasks of a queue; it does not check
  ``AIGCQ_USER_MAX_RUNNING`` on those claims (issue 37 item 8: the bug, modelled as it
  was). Its sweep ends ``TaskExpired`` what is past its start deadline anywhere in a
  queue (start deadlines applied with either scheduler at 48226d9); it has no
  deadline-aware overflow.
* ``aigcq``: the one scheduler (docs/scheduling.md). Each round reads what ``window.lua``
  reads: of each queue, the first ``free + paid room + 1`` (at most ``KEY_HEAD_MAX``) tasks
  of every ready key (one end user's tasks of one workflow; a paused workflow's keys are
  not ready; a key whose user is at the limit is passed over), and the ``RESCUE_MAX`` (64)
  waiting tasks with the earliest start deadlines wherever they sit (the paused among them
  left out); :func:`aigcq.scheduler.fair.held_beyond` holds those beyond a user's limit or a
  project's ``max`` as :func:`aigcq.scheduler.fair.inputs` does (off our GPUs; one with a
  start deadline may go to its paid platform), and
  :func:`aigcq.scheduler.policy.plan_round` decides; the round claims what it says (a
  claim passes over a user at the limit, as ``claim.lua`` does) and expires what is past
  its start deadline, as the sweep does anywhere in a queue. Usage (GPU-seconds) is
  charged when a run starts on our GPUs (its workflow's recent mean, ``mark_running.lua``)
  and corrected to the real run time when it ends, decayed with ``--half-life``.

A round runs after every event (a submit, a GPU or paid task ending, a pause or resume)
and once a second (the sweep), as the dispatch loop does; a round with no free GPU and no
paid room does nothing (as ``dispatch._plan_round`` returns early).

Workloads: ``bursts`` (4 projects, one with 60-task bursts every 10 min), ``bursts_tight``
(its paid cap 4 instead of 8), ``flood`` (one user submits 3,000 tasks over 20 min),
``deep_paused`` (shop's ``upscale`` workflow paused for 20 min while a batch of 1,800 of
its tasks queues ahead of shop's others), ``user_limits`` (``AIGCQ_USER_MAX_RUNNING=2``,
one user's batch of 1,500 at the head of shop's queue), ``deep_deadlines`` (a batch of
3,000 tasks without start deadlines in shop's queue, shop's tasks with deadlines arriving
behind it) and ``long`` (``bursts`` over ``--long-hours``). The batches send no start
deadline; every other task has its project's maximum wait (``AIGCQ_MAX_WAIT_MS``).

Measured per workload, seed and policy: paid tasks and spend (and how many of them had a
start deadline), start-deadline misses (late starts, and expired tasks), GPU utilisation
while any task waited and while *runnable* work waited (a waiting task whose workflow is
not paused, whose user is below the limit and whose project is below its ``max``), the
user-limit excess (the most tasks one user ran at once on our GPUs beyond the limit),
p50/p99 wait per project and per user, and under the flood Jain's index of GPU-seconds
across the equal-weight projects: each project's GPU-seconds over its max-min fair share
of what the fleet ran (its own GPU demand, capped at an equal split of the rest).

``targets`` checks issue 37's, on every workload and seed: ``aigcq`` pays for no more
tasks than ``today`` and for >= 30% fewer where every task sends a start deadline
(:data:`DEADLINE_WORKLOADS`; in the others a batch without deadlines overflows when it
cannot start now under both policies, seed 000 §3.6, so only "no more" applies), misses
no more start deadlines, Jain >= 0.95 under the flood, utilisation >= 98% while runnable
work waits, and no user-limit excess (nor project ``max`` excess: a scenario may give a
project a model.json ``share``, :class:`Share`; its ``min`` is the planner's ``owed``).
Each run's ``misses_by_user`` and ``by_project`` say whose deadlines were missed.

``--smoke`` (CI, ``tests/unit/test_fleet_sim.py``): 6 simulated minutes of every workload,
its events and batches scaled down, one seed, in a few seconds. The full run (7 workloads,
3 seeds, both policies) takes about 2 minutes of one core.
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
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# this checkout's server and wire (domain's error codes), installed or not
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "aigcq-wire" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from aigcq.scheduler.dispatch import BATCH, KEY_HEAD_MAX
from aigcq.scheduler.fair import held_beyond
from aigcq.scheduler.policy import (
    RESCUE_MAX,
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
#: tasks of paused workflows the old fifo passed over at the head of a queue, at most
#: (aigcq.scheduler.dispatch.PASS_OVER before issue 37)
PASS_OVER = 1000
SWEEP_S = 1.0  # AIGCQ_SWEEP_INTERVAL_S
#: the workloads where every task sends a start deadline: the >= 30% fewer paid target
DEADLINE_WORKLOADS = ("bursts", "bursts_tight", "flood", "long")
WORKLOADS = ("bursts", "bursts_tight", "flood", "deep_paused", "user_limits", "deep_deadlines",
             "long")  # fmt: skip


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
class Batch:
    """One user's ``tasks`` of one workflow, evenly over [start, start + over_s), sent
    without a start deadline (a bulk job)."""

    project: str
    user: str
    workflow: str
    tasks: int
    start_s: float
    over_s: float


@dataclass(frozen=True)
class Pause:
    """An operator pauses a project's workflow over [start, end)."""

    project: str
    workflow: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Share:
    """A project's model.json ``share``."""

    min: int = 0
    max: int | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class Scenario:
    name: str
    gpus: int
    hours: float
    flood: Flood | None = None
    #: project -> its paid account's cap, instead of its own
    paid_caps: dict[str, int] = field(default_factory=dict)
    batches: tuple[Batch, ...] = ()
    pauses: tuple[Pause, ...] = ()
    #: AIGCQ_USER_MAX_RUNNING (0: none)
    user_limit: int = 0
    #: project -> its share of our GPUs (model.json)
    shares: dict[str, Share] = field(default_factory=dict)


@dataclass(eq=False)
class Task:
    id: str
    project: str
    user: str
    workflow: str
    created: float
    run_s: float  # on our GPUs, without a model load
    start_by: float | None
    start: float | None = None
    where: str = ""  # gpu | paid | expired ("" while it waits, or before its submit)
    gpu_s: float = 0.0  # GPU time it held (run + model load)
    charged: float = 0.0  # GPU-seconds charged at its start (the workflow's mean)
    ended: float = 0.0

    @property
    def queue(self) -> Queue:
        return (self.project, PLATFORM)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.project, self.user, self.workflow)


def workload(scenario: Scenario, seed: int) -> list[Task]:
    """Every task of the scenario, by submit time: Poisson arrivals per project with its
    users picked at random, its bursts, the flood and the batches."""
    rng = random.Random(seed)
    horizon = scenario.hours * 3600
    tasks: list[Task] = []

    def add(p: Project, user: str, at: float, wf: str = "", deadline: bool = True) -> None:
        if not wf:
            names, weights = zip(*p.mix.items(), strict=True)
            wf = rng.choices(names, weights)[0]
        start_by = at + p.max_wait_s if deadline else None
        tasks.append(
            Task(f"{p.name}-{len(tasks)}", p.name, user, wf, at,
                 WORKFLOWS[wf].sample(rng), start_by)
        )  # fmt: skip

    for p in PROJECTS:
        for user, at in _arrivals(p, horizon, rng):
            add(p, user, at)
    if scenario.flood is not None:
        f = scenario.flood
        project = next(p for p in PROJECTS if p.name == f.project)
        for i in range(f.tasks):
            add(project, f"{f.project}-flooder", f.start_s + i * f.over_s / f.tasks)
    for b in scenario.batches:
        project = next(p for p in PROJECTS if p.name == b.project)
        for i in range(b.tasks):
            add(project, b.user, b.start_s + i * b.over_s / b.tasks, b.workflow, deadline=False)
    tasks.sort(key=lambda t: t.created)
    return tasks


def _arrivals(p: Project, horizon: float, rng: random.Random) -> Iterator[tuple[str, float]]:
    """A project's own submits (user, when): Poisson arrivals and its bursts (drawn as
    they are added, so a seed's workload is the one before issue 37's workloads)."""
    t = rng.expovariate(p.rate_per_s)
    while t < horizon:
        yield f"{p.name}-u{rng.randrange(p.users)}", t
        t += rng.expovariate(p.rate_per_s)
    if p.burst:
        for start in itertools.count(p.burst_every_s / 2, p.burst_every_s):
            if start >= horizon:
                break
            for _ in range(p.burst):
                yield f"{p.name}-u0", start + rng.uniform(0, 10)


# ---- the fleet ------------------------------------------------------------------------


@dataclass
class Gpu:
    task: Task | None = None
    last_workflow: str = ""


def _live(line: deque[Task]) -> Iterator[Task]:
    """The waiting tasks of ``line`` (claimed, paid and expired ones are left in place)."""
    return (t for t in line if not t.where)


@dataclass
class Fleet:
    """The simulated fleet: queues, GPUs, the paid accounts, and what was measured."""

    scenario: Scenario
    half_life_s: float = 300.0
    tasks: list[Task] = field(default_factory=list)
    now: float = 0.0
    #: each queue's waiting tasks by submit (its rank), the old list and the seed's key
    lines: dict[Queue, deque[Task]] = field(default_factory=lambda: defaultdict(deque))
    #: each queue's waiting tasks by key (end user, workflow), by rank
    keyed: dict[Queue, dict[tuple[str, str], deque[Task]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    #: waiting tasks by (project, user, workflow), and by queue
    waiting: dict[tuple[str, str, str], int] = field(default_factory=dict)
    backlog: dict[Queue, int] = field(default_factory=lambda: defaultdict(int))
    #: the waiting tasks with a start deadline: (start_by, seq, task), taken out lazily
    deadlines: list[tuple[float, int, Task]] = field(default_factory=list)
    paused: set[tuple[str, str]] = field(default_factory=set)
    gpus: list[Gpu] = field(default_factory=list)
    paid_running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: tasks on our GPUs by project and by (project, user)
    running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    user_running: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    events: list[tuple[float, int, str, Any]] = field(default_factory=list)
    seq: Iterator[int] = field(default_factory=itertools.count)
    # what the rounds know: the workflows' recent means; decayed usage, charged at a run's
    # start and corrected at its end
    means: dict[str, tuple[float, int]] = field(default_factory=dict)
    usage: dict[str, tuple[float, float]] = field(default_factory=dict)
    user_usage: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # measured
    waiting_gpu_s: float = 0.0  # ∫ GPUs over time while a task waited
    busy_while_waiting_s: float = 0.0  # ∫ busy GPUs over the same time
    runnable_gpu_s: float = 0.0  # ∫ GPUs over time while a runnable task waited
    busy_while_runnable_s: float = 0.0
    most_per_user: int = 0  # the most tasks one user ran at once on our GPUs
    most_over_max: int = 0  # the most GPUs a project ran beyond its share's max
    most_running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    last_t: float = 0.0

    def __post_init__(self) -> None:
        self.gpus = [Gpu() for _ in range(self.scenario.gpus)]

    def at(self, t: float, kind: str, what: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, what))

    # -- waiting work

    def submit(self, task: Task) -> None:
        q = task.queue
        self.lines[q].append(task)
        self.keyed[q].setdefault((task.user, task.workflow), deque()).append(task)
        self.waiting[task.key] = self.waiting.get(task.key, 0) + 1
        self.backlog[q] += 1
        if task.start_by is not None:
            heapq.heappush(self.deadlines, (task.start_by, next(self.seq), task))
        line = self.lines[q]
        if len(line) > 2 * self.backlog[q] + 1000:  # drop what left it
            self.lines[q] = deque(_live(line))

    def left(self, task: Task, where: str) -> None:
        """``task`` stops waiting: it started (gpu | paid) or expired."""
        assert not task.where
        task.where = where
        self.backlog[task.queue] -= 1
        n = self.waiting[task.key] - 1
        if n:
            self.waiting[task.key] = n
        else:
            del self.waiting[task.key]

    def key_head(self, q: Queue, key: tuple[str, str], n: int) -> list[Task]:
        """The first ``n`` waiting tasks of ``key`` (its line trimmed of those gone)."""
        line = self.keyed[q][key]
        while line and line[0].where:
            line.popleft()
        if not line:
            del self.keyed[q][key]
            return []
        return list(itertools.islice(_live(line), n))

    def earliest_deadlines(self, n: int) -> list[Task]:
        """The ``n`` waiting tasks with the earliest start deadlines (``{P}:startby``)."""
        out: list[tuple[float, int, Task]] = []
        while self.deadlines and len(out) < n:
            entry = heapq.heappop(self.deadlines)
            if not entry[2].where:
                out.append(entry)
        for entry in out:
            heapq.heappush(self.deadlines, entry)
        return [task for _, _, task in out]

    def limited(self, project: str, user: str) -> bool:
        """Whether ``user`` is at ``AIGCQ_USER_MAX_RUNNING`` on our GPUs."""
        limit = self.scenario.user_limit
        return limit > 0 and bool(user) and self.user_running[(project, user)] >= limit

    def runnable(self, key: tuple[str, str, str]) -> bool:
        project, user, workflow = key
        if (project, workflow) in self.paused or self.limited(project, user):
            return False
        share = self.scenario.shares.get(project)
        return share is None or share.max is None or self.running[project] < share.max

    # -- time

    def advance(self, t: float) -> None:
        """Integrate utilisation over [last event, t): while anything waits, and while a
        runnable task waits."""
        dt = t - self.last_t
        if dt > 0 and self.waiting:
            busy = sum(g.task is not None for g in self.gpus)
            self.waiting_gpu_s += dt * len(self.gpus)
            self.busy_while_waiting_s += dt * busy
            if any(self.runnable(k) for k in self.waiting):
                self.runnable_gpu_s += dt * len(self.gpus)
                self.busy_while_runnable_s += dt * busy
        self.last_t = self.now = t

    def idle(self) -> list[Gpu]:
        return [g for g in self.gpus if g.task is None]

    # -- runs

    def run_on_gpu(self, task: Task, gpu: Gpu) -> None:
        """A start on our GPUs: charges its project and user its workflow's recent mean
        (``mark_running.lua``)."""
        self.left(task, "gpu")
        load = MODEL_LOAD_S if gpu.last_workflow != task.workflow else 0.0
        gpu.task, gpu.last_workflow = task, task.workflow
        task.start, task.gpu_s = self.now, task.run_s + load
        self.at(self.now + task.gpu_s, "gpu_end", gpu)
        self.running[task.project] += 1
        self.most_running[task.project] = max(
            self.most_running[task.project], self.running[task.project]
        )
        who = (task.project, task.user)
        self.user_running[who] += 1
        self.most_per_user = max(self.most_per_user, self.user_running[who])
        share = self.scenario.shares.get(task.project)
        if share is not None and share.max is not None:
            self.most_over_max = max(self.most_over_max, self.running[task.project] - share.max)
        task.charged = self.mean_run(task.workflow)
        self.use_gpu(task, task.charged)

    def gpu_ended(self, gpu: Gpu) -> None:
        """A run ends: its charge is corrected to the time it really ran."""
        task = gpu.task
        assert task is not None
        self.recorded_run(task)
        self.use_gpu(task, task.gpu_s - task.charged)
        self.running[task.project] -= 1
        self.user_running[(task.project, task.user)] -= 1
        task.ended, gpu.task = self.now, None

    def use_gpu(self, task: Task, gpu_s: float) -> None:
        half = self.half_life_s
        self.usage[task.project] = (charge(self.usage.get(task.project), gpu_s, self.now, half),
                                    self.now)  # fmt: skip
        who = (task.project, task.user)
        self.user_usage[who] = (charge(self.user_usage.get(who), gpu_s, self.now, half), self.now)

    def run_paid(self, task: Task) -> None:
        """A paid create now: its start, as the start deadline counts it (the platform
        runs it after ``PAID_LATENCY_S``)."""
        self.left(task, "paid")
        self.paid_running[task.project] += 1
        task.start = self.now
        self.at(self.now + PAID_LATENCY_S + task.run_s * PAID_SLOWER, "paid_end", task)

    def expire(self, task: Task) -> None:
        if not task.where:
            self.left(task, "expired")

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


def charge(before: tuple[float, float] | None, add: float, now: float, half_life_s: float) -> float:
    """Decayed usage plus ``add`` (what ``use_gpu`` in ``_prelude.lua`` records)."""
    if before is None:
        return add
    value, at = before
    return decayed(value, now - at, half_life_s) + add


Policy = Callable[[Fleet], None]


# ---- the policies ---------------------------------------------------------------------


def today(fleet: Fleet) -> Policy:
    """The old fifo path: round robin over the configured queues (a round's two
    ``_internal_shares`` calls, ours and the other processes', each took a turn of the
    round robin), first come first served from each queue's head; with a workflow paused,
    the tasks not paused among the first ``BATCH`` + ``PASS_OVER`` of a queue, claimed by
    id; no user-limit check."""
    rr = itertools.count()
    queues = [(p.name, PLATFORM) for p in PROJECTS]  # model.json's order

    def round_(f: Fleet) -> None:
        start, _ = next(rr), next(rr)
        idle = f.idle()
        if not any(f.backlog[q] for q in queues) or (
            not idle and all(f.paid_room(q[0]) <= 0 for q in queues)
        ):
            return  # nothing can be claimed
        heads: dict[Queue, list[Task]] = {}
        for q in queues:
            n = min(f.backlog[q], BATCH)
            if f.paused:  # the tasks not paused, among the first n + PASS_OVER
                ahead = itertools.islice(_live(f.lines[q]), n + PASS_OVER)
                heads[q] = [t for t in ahead if (t.project, t.workflow) not in f.paused]
            else:
                heads[q] = list(itertools.islice(_live(f.lines[q]), n))
        demands = [min(len(heads[q]), BATCH) for q in queues]
        shares = share_round_robin(demands, len(idle), start)
        for q, share, demand in zip(queues, shares, demands, strict=True):
            split = plan(demand, share, max(f.paid_room(q[0]), 0))
            line = heads[q]
            for task in line[: split.internal]:
                f.run_on_gpu(task, idle.pop())
            for task in line[split.internal : split.internal + split.external]:
                f.run_paid(task)

    return round_


def aigcq(tuning: Tuning) -> Callable[[Fleet], Policy]:
    """The one scheduler: ``window.lua``'s read, ``fair.inputs``' trims, ``plan_round``."""

    def make(fleet: Fleet) -> Policy:
        scenario = fleet.scenario
        ceilings = {p: s.max for p, s in scenario.shares.items() if s.max is not None}

        def round_(f: Fleet) -> None:
            idle = f.idle()
            queues = [q for q in f.keyed if f.backlog[q] > 0]
            rooms = {q: max(f.paid_room(q[0]), 0) for q in queues}
            if not queues or (not idle and not any(rooms.values())):
                return
            read = window_read(f, queues, min(len(idle) + sum(rooms.values()) + 1, KEY_HEAD_MAX))
            tasks = [
                Waiting(t.id, t.queue, t.created, f.mean_run(t.workflow), user=t.user,
                        start_by=t.start_by)
                for t in read.values()
            ]  # fmt: skip
            limit = scenario.user_limit
            limits = {(t.queue[0], t.user): limit for t in tasks if t.user} if limit > 0 else {}
            tasks = held_beyond(tasks, f.user_running, limits, lambda t: (t.queue[0], t.user))
            tasks = held_beyond(tasks, f.running, ceilings, lambda t: t.queue[0])
            if not tasks:
                return
            busy = [
                time_left(f.mean_run(g.task.workflow), f.now - (g.task.start or f.now))
                for g in f.gpus
                if g.task is not None
            ]
            d = plan_round(tasks, Pool(len(idle), 0, busy), shares(f, read), rooms, f.now, tuning)
            for task_id in itertools.chain.from_iterable(d.internal.values()):
                task = read[task_id]
                if not f.limited(task.project, task.user):  # claim.lua passes over one at it
                    f.run_on_gpu(task, idle.pop())
            for task_id in itertools.chain.from_iterable(d.paid.values()):
                f.run_paid(read[task_id])
            for task_id in d.expired:
                f.expire(read[task_id])

        return round_

    return make


def window_read(f: Fleet, queues: list[Queue], n: int) -> dict[str, Task]:
    """What ``window.lua`` reads: of each queue, the first ``n`` tasks of every ready key
    whose user is below the limit (the keys in the order of their heads), then the
    :data:`RESCUE_MAX` earliest start deadlines of every waiting task, those paused left
    out (a limited user's are read: ``fair.held_beyond`` keeps them for their paid platform)."""
    read: dict[str, Task] = {}
    for q in queues:
        heads = []
        for key in list(f.keyed[q]):
            user, workflow = key
            if (q[0], workflow) not in f.paused and not f.limited(q[0], user):
                heads += f.key_head(q, key, n)
        heads.sort(key=lambda t: t.created)
        read.update((t.id, t) for t in heads)
    for t in f.earliest_deadlines(RESCUE_MAX):
        if (t.project, t.workflow) not in f.paused:  # a limited user's too: held for paid
            read.setdefault(t.id, t)
    return read


def shares(f: Fleet, read: dict[str, Task]) -> Shares:
    """The weights, the decayed usage of the projects and of the users read, and what the
    projects' minimums still owe."""
    now, half = f.now, f.half_life_s
    users = {(t.project, t.user) for t in read.values()}
    return Shares(
        weights={p: s.weight for p, s in f.scenario.shares.items()},
        usage={p: decayed(v, now - at, half) for p, (v, at) in f.usage.items()},
        user_usage={
            u: decayed(v, now - at, half) for u, (v, at) in f.user_usage.items() if u in users
        },
        owed={p: s.min - f.running[p] for p, s in f.scenario.shares.items()},
    )


def sweep_expired(f: Fleet) -> None:
    """The sweep: tasks anywhere in a queue past their start deadline end TaskExpired."""
    while f.deadlines and f.deadlines[0][0] <= f.now:
        f.expire(heapq.heappop(f.deadlines)[2])


def event(f: Fleet, kind: str, what: Any, expires: bool) -> None:
    if kind == "submit":
        f.submit(what)
    elif kind == "gpu_end":
        f.gpu_ended(what)
    elif kind == "paid_end":
        f.paid_running[what.project] -= 1
        what.ended = f.now
    elif kind == "pause":
        f.paused.add(what)
    elif kind == "resume":
        f.paused.discard(what)
    elif kind == "sweep" and expires:
        sweep_expired(f)


def simulate(
    scenario: Scenario,
    seed: int,
    make: Callable[[Fleet], Policy],
    expires: bool,
    half_life_s: float = 300.0,
) -> Fleet:
    f = Fleet(scenario, half_life_s)
    policy = make(f)
    tasks = workload(scenario, seed)
    for task in tasks:
        f.at(task.created, "submit", task)
    for pause in scenario.pauses:
        f.at(pause.start_s, "pause", (pause.project, pause.workflow))
        f.at(pause.end_s, "resume", (pause.project, pause.workflow))
    horizon = scenario.hours * 3600
    f.at(SWEEP_S, "sweep")
    f.tasks = tasks
    while f.events:
        t = f.events[0][0]
        f.advance(t)
        while f.events and f.events[0][0] == t:
            _, _, kind, what = heapq.heappop(f.events)
            event(f, kind, what, expires)
            if kind == "sweep" and (t < horizon or (f.waiting and t < horizon + 86400)):
                f.at(t + SWEEP_S, "sweep")  # past the horizon, while any waits
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


def late(t: Task) -> bool:
    return t.start is not None and t.start_by is not None and t.start > t.start_by


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
    n_late = sum(1 for t in started if late(t))
    expired = sum(1 for t in tasks if t.where == "expired")
    limit = f.scenario.user_limit
    out: dict[str, Any] = {
        "tasks": len(tasks),
        "with_deadline": sum(1 for t in tasks if t.start_by is not None),
        "gpu_utilisation_while_waiting": round(f.busy_while_waiting_s / f.waiting_gpu_s, 4)
        if f.waiting_gpu_s
        else 1.0,
        "gpu_utilisation_while_runnable": round(f.busy_while_runnable_s / f.runnable_gpu_s, 4)
        if f.runnable_gpu_s
        else 1.0,
        "runnable_waiting_s": round(f.runnable_gpu_s / len(f.gpus)),
        "paid_tasks": len(paid),
        "paid_with_deadline": sum(1 for t in paid if t.start_by is not None),
        "spend": round(sum(WORKFLOWS[t.workflow].price for t in paid), 2),
        "deadline_misses": n_late + expired,
        "late_starts": n_late,
        "expired": expired,
        "never_started": sum(1 for t in tasks if t.where == ""),
        "user_limit": limit,
        "most_per_user": f.most_per_user,
        "user_limit_excess": max(f.most_per_user - limit, 0) if limit > 0 else 0,
        "project_max_excess": max(f.most_over_max, 0),
        "misses_by_user": {
            u: n
            for u in sorted({t.user for t in tasks})
            if (n := sum(1 for t in tasks if t.user == u and (late(t) or t.where == "expired")))
        },
        "by_project": {
            p: {
                "paid": sum(1 for t in mine if t.where == "paid"),
                "late": sum(1 for t in mine if late(t)),
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


def scenarios(hours: float, long_hours: float) -> dict[str, Scenario]:
    """The workloads; their events (the flood, the pauses, the batches) at these times and
    sizes over 2 h, scaled down with a shorter run (``--smoke``)."""
    s = min(1.0, hours / 2)

    def n(tasks: int) -> int:
        return max(1, round(tasks * s))

    flood = Flood("shop", n(3000), 1800.0 * s, 1200.0 * s)  # 2.5 tasks/s for 20 min
    return {
        "bursts": Scenario("bursts", 16, hours),
        "bursts_tight": Scenario("bursts_tight", 16, hours, paid_caps={"poster": 4}),
        "flood": Scenario("flood", 16, hours, flood),
        # shop's upscale paused for 20 min while a batch of 1,800 of it queues ahead of
        # shop's other work (past the old fifo's BATCH + PASS_OVER)
        "deep_paused": Scenario(
            "deep_paused", 16, hours,
            batches=(Batch("shop", "shop-batch", "upscale", n(1800), 600.0 * s, 300.0 * s),),
            pauses=(Pause("shop", "upscale", 600.0 * s, 1800.0 * s),),
        ),
        # AIGCQ_USER_MAX_RUNNING=2, one user's 1,500 at the head of shop's queue
        "user_limits": Scenario(
            "user_limits", 16, hours, user_limit=2,
            batches=(Batch("shop", "shop-bulk", "t2i", n(1500), 300.0 * s, 10.0 * s),),
        ),
        # 3,000 tasks without a start deadline, shop's dated tasks arriving behind them
        "deep_deadlines": Scenario(
            "deep_deadlines", 16, hours,
            batches=(Batch("shop", "shop-backlog", "t2i", n(3000), 600.0 * s, 60.0 * s),),
        ),
        "long": Scenario("long", 16, long_hours),
    }  # fmt: skip


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    tuning = Tuning(args.lend, args.patience, args.margin)
    policies: dict[str, tuple[Callable[[Fleet], Policy], bool]] = {
        "today": (today, True),
        "aigcq": (aigcq(tuning), True),
    }
    every = scenarios(args.hours, args.long_hours)
    chosen = {name: every[name] for name in args.workloads}
    runs: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    for name, scenario in chosen.items():
        flood = scenario.flood
        window = None if flood is None else (flood.start_s, flood.start_s + flood.over_s)
        for seed in args.seeds:
            for policy, (make, expires) in policies.items():
                t0 = time.perf_counter()
                fleet = simulate(scenario, seed, make, expires, args.half_life)
                out = figures(fleet, window)
                out["sim_s"] = round(time.perf_counter() - t0, 1)
                runs.setdefault(name, {}).setdefault(seed, {})[policy] = out
                print(name, seed, policy, "done", out["sim_s"], "s", file=sys.stderr)
    return {
        "seeds": args.seeds,
        "hours": args.hours,
        "long_hours": args.long_hours,
        "deadline_workloads": [w for w in DEADLINE_WORKLOADS if w in chosen],
        "table": table(runs),
        "targets": targets(runs),
        "all_met": all(t["met"] for by_seed in targets(runs).values() for t in by_seed.values()),
        "workloads": runs,
        "sim_seconds": round(time.perf_counter() - started, 1),
    }


def table(runs: dict[str, dict[int, dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """{workload: {seed: {policy: {paid, misses, util_runnable, jain?, user_limit_excess}}}}"""
    out: dict[str, Any] = {}
    for name, by_seed in runs.items():
        for seed, by_policy in by_seed.items():
            for policy, r in by_policy.items():
                row = {
                    "paid": r["paid_tasks"],
                    "misses": r["deadline_misses"],
                    "util_runnable": r["gpu_utilisation_while_runnable"],
                    "user_limit_excess": r["user_limit_excess"],
                }
                if "jain_gpu_s" in r:
                    row["jain"] = r["jain_gpu_s"]
                out.setdefault(name, {}).setdefault(str(seed), {})[policy] = row
    return out


def targets(runs: dict[str, dict[int, dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Issue 37's targets on every workload and seed: ``aigcq`` pays for no more tasks than
    ``today``, and >= 30% fewer in :data:`DEADLINE_WORKLOADS`; misses no more start
    deadlines; Jain >= 0.95 under the flood; utilisation >= 98% while runnable work
    waits; no user-limit (nor project max) excess."""
    out: dict[str, Any] = {}
    for name, by_seed in runs.items():
        for seed, r in by_seed.items():
            a, b = r["aigcq"], r["today"]
            fewer = 1 - a["paid_tasks"] / b["paid_tasks"] if b["paid_tasks"] else 0.0
            checks = {
                "paid_no_more": a["paid_tasks"] <= b["paid_tasks"],
                "misses_no_more": a["deadline_misses"] <= b["deadline_misses"],
                "util_runnable_98": a["gpu_utilisation_while_runnable"] >= 0.98,
                "no_limit_excess": a["user_limit_excess"] == 0 and a["project_max_excess"] == 0,
            }
            if name in DEADLINE_WORKLOADS:
                checks["paid_30pct_fewer"] = fewer >= 0.30
            if "jain_gpu_s" in a:
                checks["jain_95"] = a["jain_gpu_s"] >= 0.95
            out.setdefault(name, {})[str(seed)] = {
                "paid_aigcq_vs_today": [a["paid_tasks"], b["paid_tasks"]],
                "paid_fewer_by": round(fewer, 3),
                "misses_aigcq_vs_today": [a["deadline_misses"], b["deadline_misses"]],
                **checks,
                "met": all(checks.values()),
            }
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[27, 28, 29])
    p.add_argument("--hours", type=float, default=2.0, help="the standard workloads' length")
    p.add_argument("--long-hours", type=float, default=4.0, help="the long workload's length")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--smoke", action="store_true", help="CI: 0.1 h, scaled events, one seed")
    p.add_argument("--half-life", type=float, default=300.0, help="usage half-life (s)")
    default = Tuning()
    p.add_argument("--lend", type=float, default=default.lend_s, help="Tuning.lend_s")
    p.add_argument("--patience", type=float, default=default.patience)
    p.add_argument("--margin", type=float, default=default.margin)
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="issue 40: static / queue_depth / all_paid / planner capacity policies over "
        "owned + rentable GPUs (bench/fleet_autoscale.py)",
    )
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.smoke:
        args.hours, args.long_hours, args.seeds = 0.1, 0.1, args.seeds[:1]
    if args.autoscale:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from bench.fleet_autoscale import autoscale

        every = scenarios(args.hours, args.long_hours)
        chosen = {name: every[name] for name in args.workloads}
        return autoscale(chosen, args.seeds, lambda s: print(s, file=sys.stderr))
    return run_all(args)


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
