"""Who runs first (issues 27 and 37): the pure decision of one dispatch round, no I/O.

A round sees the waiting tasks our GPUs could take of each queue they serve (the heads of
its ready keys and the earliest start deadlines, :mod:`aigcq.scheduler.fair`; a task
``held`` off our GPUs by a limit may only go paid), the internal pool (slots free here,
slots free in other processes, the expected time left of each busy slot), the projects'
weights and recent usage, and the room on each queue's paid platform. It answers which
tasks to claim for the internal target now, which to send to the paid platform now, which
have missed their start deadline, and an estimated internal start (ETA) for every task
that keeps waiting.

*Fair shares by GPU time.* Slots go to AIGC projects, and inside a project to its end
users (``userId``), by least recent usage per unit of weight: usage is GPU-seconds
(each dispatched task charged the recent mean run time of its workflow), decayed with a
half-life (:func:`decayed`). Each grant charges the project and the user at once, so one
round's slots interleave tenants; equal usage falls back to the oldest waiting task. A
flooding tenant's usage grows with every slot it gets and the others' decays, so nobody
waits behind a flood, and a tenant with work waiting always gets a slot once its decayed
usage is the least (never starved).

*Priority as a time credit.* A task's ``credit_s`` puts it that far ahead of its own
tenant's later submissions (it is ordered as if submitted that much earlier); between
tenants (projects, and end users inside a project) it counts for nothing: least recent
usage per weight, then the oldest task. Low-priority work is delayed, not starved.

*Deadline-aware overflow.* The tasks are laid out in that fair order over the pool (a
list schedule: each takes the slot that frees first and holds it for its expected run
time); where a task lands is its estimated start (its ETA). A task with a start deadline
(``start_by``) that would miss it, or come within a margin of it (the estimate cannot
see the lighter tenants' tasks still to come, which go ahead), is rescued, earliest
deadline first (:class:`_Rescue`): it goes to its paid platform if that has room, else
it borrows the earliest safe place of another tenant's task that can wait that long
within its own deadline, else another tenant's task goes to *its* paid platform to free
a place for it (overflow-when-full's effect, only where it saves a deadline). Only a
tenant whose recent usage is not far ahead of the lender's borrows so: a flood borrows
from nobody. A task
past its deadline is expired (never paid), unless it ``keep_waiting``: then it runs
wherever a place comes first. A task with no deadline overflows as before issue 27:
when it cannot start on our GPUs now and has waited ``overflow_after_s``. Slots free in
other processes are waited for, never paid around (as in :func:`routing.plan`).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: a queue: (AIGC project, platform)
Queue = tuple[str, str]

#: kinds of slot in the list schedule, in the order equal times are taken
_MINE, _ELSEWHERE, _BUSY = 0, 1, 2


def decayed(value: float, age_s: float, half_life_s: float) -> float:
    """``value`` (GPU-seconds) recorded ``age_s`` ago, halved every ``half_life_s``."""
    if half_life_s <= 0:
        return 0.0
    return value * math.pow(0.5, max(age_s, 0.0) / half_life_s)


#: a workflow's first runs its mean is taken over; each later one weighs 1/RUN_WINDOW
RUN_WINDOW = 20


def next_mean(mean: float, count: int, sample_s: float) -> tuple[float, int]:
    """A workflow's recent mean run time after one more run of ``sample_s``: the plain
    mean of its first :data:`RUN_WINDOW` runs, then an exponential moving average."""
    count = min(count + 1, RUN_WINDOW)
    return mean + (sample_s - mean) / count, count


def time_left(mean_run_s: float, elapsed_s: float) -> float:
    """The expected seconds left of a run that has taken ``elapsed_s`` so far, for a
    workflow that recently took ``mean_run_s``: the rest of its mean, and once past it a
    tenth of it (it is overdue, and ends any moment)."""
    return max(mean_run_s - max(elapsed_s, 0.0), mean_run_s / 10)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting task as the policy sees it."""

    task_id: str
    queue: Queue
    #: when it was submitted (epoch s)
    created: float
    #: its expected GPU-seconds: the recent mean run time of its workflow
    run_s: float
    #: its end user inside the project ("": the project's tasks with no userId)
    user: str = ""
    #: its start deadline (epoch s; None: none)
    start_by: float | None = None
    #: past its start deadline it waits on (else it expires)
    keep_waiting: bool = False
    #: priority: ordered among its tenant's tasks as if submitted this much earlier
    credit_s: float = 0.0
    #: our GPUs may not take it now (its user at its limit, its project at its ``max``):
    #: only its paid platform may, to keep its start deadline
    held: bool = False

    @property
    def rank(self) -> float:
        return self.created - self.credit_s


@dataclass(frozen=True, slots=True)
class Pool:
    """Our GPUs as one round sees them (every process's)."""

    #: slots this process fills now
    free: int
    #: slots free in other processes: tasks wait for them, never paid around
    free_elsewhere: int = 0
    #: the expected seconds until each busy slot frees
    busy_s: Sequence[float] = ()

    @property
    def size(self) -> int:
        return max(self.free, 0) + max(self.free_elsewhere, 0) + len(self.busy_s)


@dataclass(frozen=True, slots=True)
class Shares:
    """What fair shares are made of: weights and decayed usage (GPU-seconds, now)."""

    #: project -> weight (unlisted: 1)
    weights: Mapping[str, float] = field(default_factory=dict)
    #: project -> recent GPU-seconds
    usage: Mapping[str, float] = field(default_factory=dict)
    #: (project, user) -> recent GPU-seconds
    user_usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    #: project -> GPUs its guaranteed minimum still owes it (its ``min`` less what runs)
    owed: Mapping[str, int] = field(default_factory=dict)

    def weight(self, project: str) -> float:
        return max(self.weights.get(project, 1.0), 1e-6)

    def norm(self, project: str) -> float:
        """The project's recent GPU-seconds per unit of weight."""
        return self.usage.get(project, 0.0) / self.weight(project)


@dataclass(frozen=True, slots=True)
class Tuning:
    """The knobs of a round (``AIGCQ_SHARE_*`` settings; defaults from bench/fleet_sim.py)."""

    #: how far a borrower's recent usage per weight may be ahead of its lender's, in
    #: seconds of the whole pool (< 0: no rescue, a task overflows only when its
    #: estimate misses)
    lend_s: float = 40.0
    #: a lender waits for a borrower at most this fraction of its own maximum wait
    patience: float = 0.3
    #: a start within this fraction of its maximum wait before the deadline is at risk
    margin: float = 0.8
    #: a task with no deadline overflows once it has waited this long
    overflow_after_s: float = 0.0
    #: fair shares between tenants (False: strict first come, first served by rank)
    shares: bool = True


@dataclass(slots=True)
class Decision:
    """What one round does."""

    #: claim for the internal target now, by queue, in order
    internal: dict[Queue, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: send to the queue's paid platform now
    paid: dict[Queue, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: past their start deadline, never started: they end ``TaskExpired``
    expired: list[str] = field(default_factory=list)
    #: estimated internal start (epoch s) of every task of the window that keeps waiting
    #: (inf: our GPUs cannot run it)
    eta: dict[str, float] = field(default_factory=dict)
    #: every task of the window in the order the pool takes them (paid and expired left out)
    order: list[str] = field(default_factory=list)
    #: GPU-seconds the internal grants charge, by project and by (project, user)
    charged: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    charged_users: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    #: when a task held back by ``overflow_after_s`` may overflow (None: none is)
    recheck_at: float | None = None


class _Tenant:
    """A project or a user in the fair order: its usage per weight, its waiting tasks."""

    __slots__ = ("norm", "tasks", "weight")

    def __init__(self, usage: float, weight: float) -> None:
        self.weight = weight
        self.norm = usage / weight
        self.tasks: list[tuple[float, int, Waiting]] = []  # a heap by (rank, list position)

    def key(self) -> tuple[float, float, int]:
        """Its place among its peers: usage per weight, then when its next task was
        submitted (a priority credit orders a tenant's own tasks, never the tenants)."""
        _, position, task = self.tasks[0]
        return (self.norm, task.created, position)


class _Project(_Tenant):
    """A project: its users, in a heap by their :meth:`_Tenant.key`."""

    __slots__ = ("owed", "users")

    def __init__(self, usage: float, weight: float, owed: int) -> None:
        super().__init__(usage, weight)
        self.owed = owed
        self.users: list[tuple[tuple[float, float, int], str, _Tenant]] = []

    def key(self) -> tuple[int, float, float, int]:  # type: ignore[override]
        """Whether its guaranteed minimum is met, usage per weight, then the age of the
        task it gives next."""
        _, created, position = self.users[0][0]
        return (0 if self.owed > 0 else 1, self.norm, created, position)


def fair_order(tasks: Sequence[Waiting], shares: Shares) -> list[Waiting]:
    """``tasks`` in the order fair shares give them slots: a project its guaranteed
    minimum still owes GPUs first, then the project with the least usage per weight; its
    user with the least usage; that user's task of lowest rank (between tenants of equal
    usage, the oldest task first, then list order); each task charges its project and its
    user its run time as it is given its place."""
    projects: dict[str, _Project] = {}
    users: dict[tuple[str, str], _Tenant] = {}
    for position, task in enumerate(tasks):
        name = task.queue[0]
        if name not in projects:
            usage, weight = shares.usage.get(name, 0.0), shares.weight(name)
            projects[name] = _Project(usage, weight, shares.owed.get(name, 0))
        who = (name, task.user)
        if who not in users:
            users[who] = _Tenant(shares.user_usage.get(who, 0.0), 1.0)
        heapq.heappush(users[who].tasks, (task.rank, position, task))
    for (name, user), tenant in users.items():
        projects[name].users.append((tenant.key(), user, tenant))
    heap = []
    for name, project in projects.items():
        heapq.heapify(project.users)
        heap.append((project.key(), name))
    heapq.heapify(heap)
    out: list[Waiting] = []
    while heap:
        _, name = heapq.heappop(heap)
        project = projects[name]
        _, user, tenant = heapq.heappop(project.users)
        _, _, task = heapq.heappop(tenant.tasks)
        out.append(task)
        project.norm += task.run_s / project.weight
        project.owed -= 1
        tenant.norm += task.run_s
        if tenant.tasks:
            heapq.heappush(project.users, (tenant.key(), user, tenant))
        if project.users:
            heapq.heappush(heap, (project.key(), name))
    return out


def plan_round(
    tasks: Sequence[Waiting],
    pool: Pool,
    shares: Shares,
    paid_room: Mapping[Queue, int],
    now: float,
    tuning: Tuning = Tuning(),
) -> Decision:
    """One round's decision (see the module's docstring). ``tasks``: each queue's window
    in list order; ``paid_room``: how many more each queue's paid platform takes now (a
    queue no paid platform serves: 0)."""
    decision = Decision()
    live: list[Waiting] = []
    held: list[Waiting] = []
    for task in tasks:
        if task.start_by is not None and task.start_by <= now and not task.keep_waiting:
            decision.expired.append(task.task_id)
        else:
            (held if task.held else live).append(task)
    room = dict(paid_room)
    for task in _rescued_held(held, room, now, tuning.margin):
        decision.paid[task.queue].append(task.task_id)
    rescue = _Rescue(shares, room, now, tuning, tuning.lend_s * pool.size)
    fair = fair_order(live, shares) if tuning.shares else sorted(live, key=lambda t: t.rank)
    order = rescue.run(fair, _slots(pool, now))
    for task in rescue.paid:
        decision.paid[task.queue].append(task.task_id)
    slots = _slots(pool, now)
    for task in order:
        at, kind = slots[0]
        at = max(at, now)
        can_pay = at > now and room.get(task.queue, 0) > 0
        if can_pay and _may_pay(task, at, now, tuning):
            room[task.queue] -= 1
            decision.paid[task.queue].append(task.task_id)
            continue
        if can_pay and task.start_by is None:  # held back by overflow_after_s
            ready = task.created + tuning.overflow_after_s
            decision.recheck_at = min(ready, decision.recheck_at or ready)
        heapq.heapreplace(slots, (at + task.run_s, _BUSY))
        decision.order.append(task.task_id)
        if kind == _MINE:
            decision.internal[task.queue].append(task.task_id)
            decision.charged[task.queue[0]] += task.run_s
            decision.charged_users[(task.queue[0], task.user)] += task.run_s
        else:
            decision.eta[task.task_id] = at
    return decision


def _rescued_held(
    held: Sequence[Waiting], room: dict[Queue, int], now: float, margin: float
) -> list[Waiting]:
    """The held tasks (our GPUs may not take them now) that go to their paid platform to
    keep their start deadline: those with one whose safe start (:func:`_safe_start`) has
    passed, earliest deadline first, while their platform has room. A held task with no
    deadline, or time left, waits for its limit to free."""
    due = [t for t in held if t.start_by is not None and now >= _safe_start(t, margin)]
    out = []
    for task in sorted(due, key=lambda t: t.start_by or 0.0):
        if room.get(task.queue, 0) > 0:
            room[task.queue] -= 1
            out.append(task)
    return out


def _slots(pool: Pool, now: float) -> list[tuple[float, int]]:
    """The pool's slots as a heap of (when it frees, its kind); one that never frees when
    the pool is empty (nothing of ours can run the tasks)."""
    slots = [(now, _MINE)] * max(pool.free, 0) + [(now, _ELSEWHERE)] * max(pool.free_elsewhere, 0)
    slots += [(now + max(left, 0.0), _BUSY) for left in pool.busy_s]
    if not slots:
        slots = [(math.inf, _BUSY)]
    heapq.heapify(slots)
    return slots


#: most tasks that would miss their deadline one round tries to rescue
RESCUE_MAX = 64


@dataclass(slots=True)
class _Rescue:
    """Before the tasks are laid out, each task that would start after its deadline (or
    within :attr:`Tuning.margin` of it) in the fair order, earliest deadline first, takes

    1. a place on its own paid platform, if that has room: the platform's room is spent
       on the tasks at risk as soon as they are seen, never left idle while one waits;
    2. else the earliest place that meets it safely (now, or outside its margin), of
       another tenant's task that may wait until the borrower's place (:func:`_may_wait`):
       nobody is made to miss a deadline, and nothing is paid;
    3. else the earliest such place of another tenant's task that goes to *its* paid
       platform now, if that has room (what overflow-when-full does to every task that
       finds no free slot, here only where it saves a deadline).

    Earliest deadline first takes the earliest places, so the places free now go to the
    tasks with the least time left: a place further off is an estimate (a busy slot
    overdue is expected to end any moment, and may not), which a task with seconds left
    cannot afford. A tenant borrows only from one it is at most ``gap`` GPU-seconds per
    weight ahead of in recent usage (:func:`_behind`): a flood borrows from nobody."""

    shares: Shares
    room: dict[Queue, int]
    now: float
    tuning: Tuning
    gap: float
    #: the tasks it sends to a paid platform now
    paid: list[Waiting] = field(default_factory=list)

    def run(self, order: list[Waiting], slots: list[tuple[float, int]]) -> list[Waiting]:
        """``order`` with places lent, and without the tasks sent to a paid platform."""
        if self.tuning.lend_s < 0 or not order:
            return order
        now, starts = self.now, []
        for task in order:  # where each place starts: non-decreasing along the order
            at, _ = slots[0]
            starts.append(max(at, now))
            heapq.heapreplace(slots, (max(at, now) + task.run_s, _BUSY))
        late = [
            i
            for i, task in enumerate(order)
            if task.start_by is not None
            and now < task.start_by
            and now < starts[i] < math.inf
            and _misses(task, starts[i], self.tuning.margin)
        ]
        late.sort(key=lambda i: order[i].start_by or 0.0)
        order = list(order)
        gone: set[int] = set()
        for i in late[:RESCUE_MAX]:
            borrower = order[i]
            assert borrower.start_by is not None
            if self.room.get(borrower.queue, 0) > 0:
                self._pay(borrower)
                gone.add(i)
                continue
            safe = max(now, _safe_start(borrower, self.tuning.margin))
            self._borrow(i, bisect.bisect_right(starts, safe, 0, i), order, starts, gone)
        return [task for k, task in enumerate(order) if k not in gone]

    def _borrow(
        self, i: int, end: int, order: list[Waiting], starts: list[float], gone: set[int]
    ) -> None:
        """Give ``order[i]`` the earliest of the places before ``end`` that a patient
        lender leaves it, else one a lender vacates by going to its paid platform. A place
        inside the borrower's margin is no loan: a task with seconds left cannot afford
        an estimate that slips (the simulator misses more deadlines with such loans)."""
        borrower = order[i]
        lenders = [j for j in range(end) if j not in gone and self._lends(i, j, order)]
        patient = (j for j in lenders if _may_wait(order[j], starts[i], self.tuning.patience))
        payers = (j for j in lenders if self.room.get(order[j].queue, 0) > 0)
        if (free := next(patient, None)) is not None:
            order[i], order[free] = order[free], borrower
        elif (payer := next(payers, None)) is not None:
            self._pay(order[payer])
            order[i], order[payer] = order[payer], borrower
            gone.add(i)

    def _lends(self, borrower: int, lender: int, order: list[Waiting]) -> bool:
        b, a = order[borrower], order[lender]
        other = (a.queue[0], a.user) != (b.queue[0], b.user)
        return other and _behind(b, a, self.shares) <= self.gap

    def _pay(self, task: Waiting) -> None:
        self.room[task.queue] -= 1
        self.paid.append(task)


def _may_wait(lender: Waiting, until: float, patience: float) -> bool:
    """Whether ``lender`` may start as late as ``until`` for another task: within
    ``patience`` (a fraction) of its own maximum wait; one with no deadline may."""
    if lender.start_by is None:
        return True
    return until - lender.created <= patience * (lender.start_by - lender.created)


def _behind(borrower: Waiting, lender: Waiting, shares: Shares) -> float:
    """How far the borrower's tenant is ahead of the lender's in recent usage per weight:
    their projects', or inside one project their users'."""
    if borrower.queue[0] != lender.queue[0]:
        return shares.norm(borrower.queue[0]) - shares.norm(lender.queue[0])
    project = borrower.queue[0]
    return shares.user_usage.get((project, borrower.user), 0.0) - shares.user_usage.get(
        (project, lender.user), 0.0
    )


def _may_pay(task: Waiting, start: float, now: float, tuning: Tuning) -> bool:
    """Whether ``task``, whose internal start is estimated at ``start`` (> now), goes to a
    paid platform that has room: it would miss its start deadline (:func:`_misses`), or
    (it has none) it has waited ``overflow_after_s``."""
    if task.start_by is None:
        return now - task.created >= tuning.overflow_after_s
    return _misses(task, start, tuning.margin)


def _safe_start(task: Waiting, margin: float) -> float:
    """The latest start that does not put ``task``'s deadline at risk (:func:`_misses`)."""
    assert task.start_by is not None
    return task.start_by - margin * max(task.start_by - task.created, 0.0)


def _misses(task: Waiting, start: float, margin: float) -> bool:
    """Whether a start at ``start`` misses ``task``'s deadline, or comes within
    ``margin`` (a fraction of its maximum wait) of it."""
    return start > _safe_start(task, margin)
