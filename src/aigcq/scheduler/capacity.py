"""Queue, rent or overflow (issue 40): how many instances each GPU pool should run. Pure, no I/O.

The planner sees the waiting work (each task's expected run time, start deadline, what it
needs and which paid platform would take it) and the work expected to arrive within the
horizon (a forecast: jobs with an ``arrive_s``; the serve loop and the simulator replay the
recent arrivals), the fleet (each instance's pool, whether it
is busy and for how long, booting and when it registers, how far into its billing step it
is), the pools' prices, boot times and bounds, and the paid platforms' price per task and
room. For the next ``horizon_s`` it prices fleets by a list schedule: every task, in the
order given (the scheduler's), takes the capable instance that frees first — a booting
one frees when it registers, a new one after its pool's boot time — and starts there if
that is within its start deadline; else it goes to its paid platform (its price), if
that has room within the deadline, else it misses (``miss_cost``). A task that would
start after the horizon with a deadline after the horizon is left to later plans. A
fleet's cost is what it pays the paid platforms, its misses, and the billing it commits
to: each new instance and each idle instance kept past the end of its billing step costs
its price for the billing steps that cover the horizon.

The search starts from waiting with what we have, every idle instance whose billing step
is ending let go (down to ``min``), and takes the cheapest improving move (keep one of those
again, or start 1, 2, 4 … instances of a pool, up to ``max``) until none improves. So:
never above ``max`` nor below ``min``; a busy or booting instance is never stopped, an idle
one only at the end of its paid step; a new instance only where the work it takes could
not start sooner (work that ends before it boots never goes to it); and the plan never
costs more than sending every task to its paid platform.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: how the search grows a pool in one move: 1, 2, 4 … instances
_GROWTH = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool of instances (``pools.json``)."""

    name: str
    price_per_hour: float
    #: seconds of one billing step (1, 60, 3600)
    step_s: float
    #: from start to a registered bridge
    boot_s: float
    min: int
    max: int
    #: node classes and models an instance offers (empty: anything)
    offers: frozenset[str] = frozenset()

    @property
    def owned(self) -> bool:
        """Owned machines: price 0, a fixed size (never started nor stopped)."""
        return self.price_per_hour <= 0

    def can_run(self, needs: frozenset[str]) -> bool:
        return not self.offers or needs <= self.offers

    def committed(self, horizon_s: float) -> float:
        """What an instance kept for the horizon is billed: its whole billing steps."""
        steps = max(math.ceil(horizon_s / self.step_s), 1) if self.step_s > 0 else 1
        return self.price_per_hour * steps * self.step_s / 3600


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One instance of the fleet now."""

    instance_id: str
    pool: str
    #: running a task (never stopped)
    busy: bool = False
    #: expected seconds until its task ends (busy)
    busy_left_s: float = 0.0
    #: seconds until it registers (None: up)
    boot_eta_s: float | None = None
    #: seconds since its billing started (its position in the billing step)
    billed_s: float = 0.0
    #: chosen for scale-in already: takes no new task
    draining: bool = False

    @property
    def booting(self) -> bool:
        return self.boot_eta_s is not None

    def free_at(self) -> float:
        if self.boot_eta_s is not None:
            return max(self.boot_eta_s, 0.0)
        return max(self.busy_left_s, 0.0) if self.busy else 0.0


@dataclass(frozen=True, slots=True)
class Job:
    """A waiting task as the planner sees it."""

    task_id: str
    #: expected GPU-seconds (its workflow's recent mean)
    run_s: float
    #: seconds from now by which it must start (math.inf: none)
    start_by: float = math.inf
    #: node classes and models it needs (empty: any instance)
    needs: frozenset[str] = frozenset()
    #: its paid platform ('': none)
    paid: str = ""
    #: what it costs there (None: the platform's price; RunningHub prices per workflow)
    price: float | None = None
    #: seconds from now until it is submitted (0: waiting now; > 0: a forecast arrival)
    arrive_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PaidSpec:
    """A paid platform: price per task, concurrent tasks it takes, and the seconds until
    each task it runs now ends."""

    name: str
    price: float
    cap: int
    busy_s: Sequence[float] = ()
    #: a task's expected run time there (None: the job's own)
    run_s: float | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    horizon_s: float = 900.0
    #: what a missed start deadline costs (None: 10x the dearest paid task, at least 1)
    miss_cost: float | None = None
    #: an idle instance whose billing step ends within this is "ending" (may be let go)
    step_end_s: float = 30.0
    #: the share of its time to its start deadline a task is planned to wait at most on
    #: our GPUs; serve passes how long the dispatch lets it wait before it pays for it (1 -
    #: ``AIGCQ_SHARE_MARGIN``, :func:`aigcq.scheduler.policy._safe_start`)
    deadline_margin: float = 0.8


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one fleet makes of the horizon."""

    cost: float
    rent: float
    paid: float
    paid_tasks: int
    misses: int
    internal_tasks: int


@dataclass(frozen=True, slots=True)
class PoolDecision:
    pool: str
    #: instances now (up and booting, draining ones included)
    current: int
    busy: int
    booting: int
    desired: int
    reason: str
    #: idle instances to drain and stop
    stop: tuple[str, ...]
    #: projected spend of the horizon: ``queue`` (the fleet as it is), ``rent`` (the best
    #: fleet that starts instances of this pool; None: it cannot grow), ``overflow``
    #: (every task paid), ``plan`` (the chosen fleet)
    spend: Mapping[str, float | None]


@dataclass(frozen=True, slots=True)
class Plan:
    pools: Mapping[str, PoolDecision]
    chosen: Outcome
    queue: Outcome
    all_paid: Outcome
    horizon_s: float
    jobs: int
    inputs: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Fleet:
    """A candidate: per pool, the ending idle instances kept and the new ones."""

    kept: Mapping[str, int]
    new: Mapping[str, int]

    def with_(self, pool: str, *, kept: int = 0, new: int = 0) -> _Fleet:
        k, n = dict(self.kept), dict(self.new)
        k[pool] = k.get(pool, 0) + kept
        n[pool] = n.get(pool, 0) + new
        return _Fleet(k, n)


def _miss_cost(settings: Settings, paid: Mapping[str, PaidSpec]) -> float:
    if settings.miss_cost is not None:
        return settings.miss_cost
    return max([1.0, *(10 * p.price for p in paid.values())])


def all_paid_bill(
    jobs: Sequence[Job],
    paid: Mapping[str, PaidSpec],
    settings: Settings = Settings(),
    floor_rent: float = 0.0,
) -> Outcome:
    """Every task of the horizon to its paid platform, no instance kept or started but
    what the pools' ``min`` forces (``floor_rent``: its billing)."""
    return _cost(jobs, {}, {}, paid, settings, floor_rent)


def _ending(inst: InstanceView, pool: PoolSpec, settings: Settings) -> bool:
    """An idle, up instance whose paid billing step is ending (it may be let go)."""
    if inst.busy or inst.booting or pool.price_per_hour <= 0:
        return False
    into = inst.billed_s % pool.step_s if pool.step_s > 0 else 0.0
    left = pool.step_s - into if into > 0 else 0.0
    return left <= max(settings.step_end_s, 0.0) or pool.step_s <= settings.step_end_s


def _cost(
    jobs: Sequence[Job],
    slots: Mapping[str, list[float]],
    pools: Mapping[str, PoolSpec],
    paid: Mapping[str, PaidSpec],
    settings: Settings,
    rent: float = 0.0,
) -> Outcome:
    """The list schedule of ``jobs`` over ``slots`` (pool -> each instance's free time)."""
    heaps = {name: sorted(times) for name, times in slots.items() if times}
    paid_heaps: dict[str, list[float]] = {}
    for p in paid.values():
        busy = sorted(max(b, 0.0) for b in p.busy_s)[: max(p.cap, 0)]
        paid_heaps[p.name] = busy + [0.0] * max(p.cap - len(busy), 0)
        heapq.heapify(paid_heaps[p.name])
    horizon, miss = settings.horizon_s, _miss_cost(settings, paid)
    margin = min(max(settings.deadline_margin, 0.0), 1.0)
    spent, paid_n, misses, inside = 0.0, 0, 0, 0
    for job in jobs:
        best: str | None = None
        for name, heap in heaps.items():
            capable = heap and pools[name].can_run(job.needs)
            if capable and (best is None or heap[0] < heaps[best][0]):
                best = name
        arrive = max(job.arrive_s, 0.0)
        start = max(heaps[best][0], arrive) if best is not None else math.inf
        latest = job.start_by * margin + arrive * (1 - margin)  # its safe start
        if start <= latest:
            if start > horizon:
                continue  # beyond the horizon, within its deadline: a later plan's
            assert best is not None
            heapq.heapreplace(heaps[best], start + max(job.run_s, 0.0))
            inside += 1
            continue
        if latest > horizon:  # at risk only after the horizon: a later plan's
            continue
        room = paid_heaps.get(job.paid)
        if room and max(room[0], arrive) <= job.start_by:
            p = paid[job.paid]
            run = p.run_s if p.run_s is not None else job.run_s
            heapq.heapreplace(room, max(room[0], arrive) + max(run, 0.0))
            spent += p.price if job.price is None else job.price
            paid_n += 1
        else:
            misses += 1
    total = rent + spent + misses * miss
    return Outcome(total, rent, spent, paid_n, misses, inside)


def plan(
    jobs: Sequence[Job],
    fleet: Sequence[InstanceView],
    pools: Mapping[str, PoolSpec],
    paid: Mapping[str, PaidSpec],
    settings: Settings = Settings(),
) -> Plan:
    """The desired instance count of every pool, why, and the projected spend of each
    choice (see the module's docstring)."""
    return _Planner(jobs, fleet, pools, paid, settings).plan()


class _Planner:
    def __init__(
        self,
        jobs: Sequence[Job],
        fleet: Sequence[InstanceView],
        pools: Mapping[str, PoolSpec],
        paid: Mapping[str, PaidSpec],
        settings: Settings,
    ) -> None:
        self.jobs, self.pools, self.paid, self.settings = jobs, pools, paid, settings
        self.by_pool: dict[str, list[InstanceView]] = {name: [] for name in pools}
        for inst in fleet:
            if inst.pool in self.by_pool:
                self.by_pool[inst.pool].append(inst)
        #: per pool, the free times of the instances that stay whatever the plan
        self.fixed: dict[str, list[float]] = {}
        #: per pool, the idle instances whose billing step ends (may be let go)
        self.ending: dict[str, list[InstanceView]] = {}
        for name, pool in pools.items():
            self.fixed[name], self.ending[name] = [], []
            for inst in self.by_pool[name]:
                if inst.draining and (inst.busy or inst.booting):
                    continue  # finishes what runs, takes nothing new
                if inst.draining or _ending(inst, pool, settings):
                    # idle: let go, or kept (a drained one undrained) if the plan needs it
                    self.ending[name].append(inst)
                else:
                    self.fixed[name].append(inst.free_at())
            # kept first: those not drained, the deepest into their step first (their
            # steps end soonest); the drained are kept last
            self.ending[name].sort(
                key=lambda i: (i.draining, -(i.billed_s % pool.step_s), i.instance_id)
            )
        self.rent_options: dict[str, Outcome] = {}

    def count(self, f: _Fleet, name: str) -> int:
        return len(self.fixed[name]) + f.kept.get(name, 0) + f.new.get(name, 0)

    def evaluate(self, f: _Fleet) -> Outcome:
        slots: dict[str, list[float]] = {}
        rent = 0.0
        for name, pool in self.pools.items():
            kept, new = f.kept.get(name, 0), f.new.get(name, 0)
            slots[name] = self.fixed[name] + [0.0] * kept + [pool.boot_s] * new
            rent += (kept + new) * pool.committed(self.settings.horizon_s)
        return _cost(self.jobs, slots, self.pools, self.paid, self.settings, rent)

    def moves(self, f: _Fleet) -> list[tuple[str, _Fleet]]:
        """Grow a pool by 1, 2, 4 … within max: its ending idle instances kept first (they
        are up now), then new ones (the pool's name: a move that starts instances)."""
        out: list[tuple[str, _Fleet]] = []
        for name, pool in self.pools.items():
            if pool.owned:
                continue  # a fixed size: nothing to start
            room = pool.max - self.count(f, name)
            left = len(self.ending[name]) - f.kept.get(name, 0)
            for k in _GROWTH:
                if k > room:
                    break
                kept = min(k, left)
                out.append((name if k > kept else "", f.with_(name, kept=kept, new=k - kept)))
        return out

    def search(self, start: _Fleet) -> tuple[_Fleet, Outcome]:
        """The cheapest improving move, until none improves."""
        best, best_out = start, self.evaluate(start)
        while True:
            move: tuple[_Fleet, Outcome] | None = None
            for grown, cand in self.moves(best):
                out = self.evaluate(cand)
                known = self.rent_options.get(grown)
                if grown and (known is None or out.cost < known.cost):
                    self.rent_options[grown] = out
                if out.cost < (move[1].cost if move else best_out.cost) - 1e-9:
                    move = (cand, out)
            if move is None:
                return best, best_out
            best, best_out = move

    def starts(self) -> tuple[_Fleet, _Fleet]:
        """What we have with the ending idle let go (down to min), and with them kept (up
        to max); below min, new ones up to min."""
        lean, full = _Fleet({}, {}), _Fleet({}, {})
        for name, pool in self.pools.items():
            if pool.owned:
                continue  # what is up is all there is: a missing machine is not started
            short, ending = pool.min - len(self.fixed[name]), len(self.ending[name])
            keep = min(max(short, 0), ending)
            lean = lean.with_(name, kept=keep, new=max(short - keep, 0))
            keep = min(ending, max(pool.max - len(self.fixed[name]), 0))
            full = full.with_(name, kept=keep, new=max(short - keep, 0))
        return lean, full

    def plan(self) -> Plan:
        lean, full = self.starts()
        best, best_out = self.search(lean)
        other, other_out = self.search(full)
        if other_out.cost < best_out.cost - 1e-9:
            best, best_out = other, other_out
        queue_out = self.evaluate(full)
        horizon = self.settings.horizon_s
        floor_rent = sum(
            (lean.kept.get(n, 0) + lean.new.get(n, 0)) * p.committed(horizon)
            for n, p in self.pools.items()
        )
        everything_paid = all_paid_bill(self.jobs, self.paid, self.settings, floor_rent)
        spend = {
            "queue": round(queue_out.cost, 4),
            "overflow": round(everything_paid.cost, 4),
            "plan": round(best_out.cost, 4),
        }
        decisions = {
            name: self.decide(name, best, best_out, queue_out, spend) for name in self.pools
        }
        return Plan(decisions, best_out, queue_out, everything_paid, horizon, len(self.jobs))

    def decide(
        self,
        name: str,
        best: _Fleet,
        best_out: Outcome,
        queue_out: Outcome,
        spend: Mapping[str, float],
    ) -> PoolDecision:
        pool, insts = self.pools[name], self.by_pool[name]
        kept, new = best.kept.get(name, 0), best.new.get(name, 0)
        stop = tuple(i.instance_id for i in self.ending[name][kept:])
        running_out = sum(1 for i in insts if i.draining and (i.busy or i.booting))
        desired = min(len(self.fixed[name]) + kept + new + running_out, pool.max)
        if pool.owned:
            desired = pool.max
        rent_out = self.rent_options.get(name)
        return PoolDecision(
            pool=name,
            current=len(insts),
            busy=sum(1 for i in insts if i.busy),
            booting=sum(1 for i in insts if i.booting),
            desired=desired,
            reason=_reason(pool, new, stop, len(insts), desired, best_out, queue_out),
            stop=stop,
            spend={**spend, "rent": None if rent_out is None else round(rent_out.cost, 4)},
        )


def _reason(
    pool: PoolSpec,
    new: int,
    stop: tuple[str, ...],
    current: int,
    desired: int,
    chosen: Outcome,
    queue: Outcome,
) -> str:
    if pool.owned:
        up = f" ({current} of {pool.max} up)" if current < pool.max else ""
        return f"owned: fixed size{up}"
    if new and current < pool.min:
        return f"below min {pool.min}: start {new}"
    if new:
        return (
            f"rent {new}: the horizon costs {chosen.cost:.2f} with them, {queue.cost:.2f} "
            f"waiting ({queue.paid_tasks} paid, {queue.misses} missed)"
        )
    if stop:
        return f"scale in {len(stop)}: idle at the end of a billing step, not needed"
    if desired >= pool.max and chosen.paid_tasks:
        return f"at max {pool.max}: {chosen.paid_tasks} tasks overflow"
    return "steady: the fleet serves the work within its deadlines"


@dataclass(frozen=True, slots=True)
class Arrival:
    """A task submitted lately, as the forecast replays it."""

    task_id: str
    #: when it was submitted (epoch s)
    created: float
    #: its expected GPU-seconds
    run_s: float
    #: seconds it had from submit to its start deadline (None: no deadline)
    patience_s: float | None = None
    needs: frozenset[str] = frozenset()
    paid: str = ""
    price: float | None = None


def _peak_start(offsets: Sequence[float], width_s: float) -> float:
    """Where the busiest ``width_s`` seconds of the sorted ``offsets`` begin (at an
    arrival: the one whose next ``width_s`` hold the most)."""
    best, at, j = 0, 0.0, 0
    for i, x in enumerate(offsets):
        j = max(j, i)
        while j + 1 < len(offsets) and offsets[j + 1] < x + width_s:
            j += 1
        if j - i + 1 >= best:  # of equal ones, the latest (the densest core)
            best, at = j - i + 1, x
    return at


def forecast(
    arrivals: Sequence[Arrival],
    now: float,
    *,
    recent_s: float,
    horizon_s: float,
    patience_s: float,
    peak_s: float = 60.0,
) -> list[Job]:
    """The next ``horizon_s`` of arrivals as the last ``recent_s`` brought them, replayed
    from their busiest ``peak_s`` on: a burst seen lately may come again at any moment, so
    a plan keeps ready for it for as long as the recent past holds one (a persistence
    forecast; 0 arrivals: none)."""
    recent = sorted(
        (a for a in arrivals if now - recent_s <= a.created < now), key=lambda a: a.created
    )
    if not recent or recent_s <= 0:
        return []
    offsets = [a.created - (now - recent_s) for a in recent]
    shift = _peak_start(offsets, peak_s)
    out: list[Job] = []
    for k in range(math.ceil(horizon_s / recent_s)):
        for a, offset in zip(recent, offsets, strict=True):
            arrive = (offset - shift) % recent_s + k * recent_s
            if arrive > horizon_s:
                continue
            wait = a.patience_s if a.patience_s is not None else patience_s
            out.append(
                Job(f"{a.task_id}+{k}", a.run_s, arrive + max(wait, 0.0), a.needs, a.paid,
                    a.price, arrive)
            )  # fmt: skip
    out.sort(key=lambda j: j.arrive_s)
    return out
