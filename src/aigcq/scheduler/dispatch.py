"""The dispatch loop: plan and claim, on events (enqueue, a freed slot, a callback) and a
slow sweep. One scheduler (issue 37, docs/scheduling.md).

Each round reads every queue's backlog and paid in-flight counts, and the pauses, in one
pipeline. The queues our GPUs serve are planned together
(:func:`aigcq.scheduler.policy.plan_round`): of each queue, the heads of its ready keys
(one end user's tasks of one workflow; a paused workflow's keys are not ready, a user at
``AIGCQ_USER_MAX_RUNNING`` is passed over) and the tasks with the earliest start deadlines
wherever they wait, with the tasks in flight, the workflows' recent run times and the
projects' and users' decayed usage (:mod:`aigcq.scheduler.fair`), in one read whose cost
grows with the ready keys and the free slots, never with the depth of a held key. The
round claims by id what the plan decides: for the internal target through its ``choose``
(among the queue's tasks in the plan's order, so capabilities per instance hold), for the
paid platform (its cap checked inside the claim script, as ever), and ends
``TaskExpired`` the tasks past their start deadline. While the internal target is
unhealthy it offers no free slot, so the plan overflows what its paid platform takes.

The queues no GPU of ours serves, and those of an internal target that is not
``preferred`` (the message-dispatcher with ``priority`` false: paid first), are split by
:func:`aigcq.scheduler.routing.plan` and claimed from the lowest ranked ready key
(first come, first served). A paused project's queues are left alone, a paused paid
account gets no task (nor one the internal target hands back: it waits), and the paused
bridges are the internal target's drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from aigcq.config import Settings
from aigcq.plumbing.background import round_failed, round_ok
from aigcq.plumbing.cancel import cancel_and_wait
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler import fair
from aigcq.scheduler.deadlines import TaskDeadlines
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.paid import PaidPlatforms
from aigcq.scheduler.pauses import Paused, parse
from aigcq.scheduler.policy import RESCUE_MAX, Decision, Queue, Waiting, plan_round
from aigcq.scheduler.routing import Plan, capped, may_overflow, plan, share_round_robin
from aigcq.scheduler.targets import HandBack, InternalTarget, Target

log = logging.getLogger(__name__)

BATCH = 256  # most tasks one queue hands out per round
#: a task the internal target hands back while its paid account is paused, and which no
#: instance could run, is tried again this much later
HELD_RECHECK_S = 5.0


#: tasks in flight a round reads per project, at most (their time left)
BUSY_MAX = 4096
#: waiting tasks of each ready key a round reads, at most
KEY_HEAD_MAX = 64


def key_head(settings: Settings, free: int, room: int) -> int:
    """How many waiting tasks of each ready key a round reads: enough for the free slots
    here and the paid platforms' room, and one more (who waits next)."""
    return min(max(free, 0) + max(room, 0) + 1, KEY_HEAD_MAX)


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """One queue as a round sees it."""

    aigc: str
    platform: str
    backlog: int
    #: the paid platform that serves it ("" = none) and its account's cap (0 = none)
    paid: str
    cap: int
    #: that platform's in-flight count: running tasks plus counted orphans
    paid_running: int
    #: an operator paused the queue's paid account: no new create on it
    paid_paused: bool = False


@dataclass(eq=False)
class DispatchLoop:
    rt: Runtime
    lifecycle: Lifecycle
    paid: PaidPlatforms
    internal: InternalTarget | None = None
    #: set by whoever frees capacity or queues work: a round runs soon after
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    #: told the bridges an operator paused (drained) whenever that set changes
    on_drains: Callable[[frozenset[str]], Awaitable[None]] | None = None
    #: when each instance the capacity planner asked for should register (epoch s): slots
    #: that free then (:meth:`aigcq.serve.capacity.CapacityPlanner.booting_at`)
    booting: Callable[[], Sequence[float]] = lambda: ()
    #: the pauses in force, as the last round read them
    paused: Paused = field(init=False, default_factory=Paused)
    _inflight: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _rr: itertools.count[int] = field(init=False, default_factory=itertools.count)
    _recheck: asyncio.TimerHandle | None = field(init=False, default=None)
    #: handed-off work
    _claims: dict[asyncio.Task[None], list[Claimed]] = field(init=False, default_factory=dict)
    stopped: bool = field(init=False, default=False)  # graceful shutdown: claim nothing more
    #: the queues an aigcq before issue 37 wrote are kept by key (done by the first round)
    _keyed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.deadlines = TaskDeadlines(self.lifecycle)

    def wake(self) -> None:
        self.wakeup.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), self.rt.settings.sweep_interval_s)
            self.wakeup.clear()
            if self.stopped:
                return
            try:
                await self.dispatch_round()
            except Exception as exc:
                round_failed(log, "dispatch round failed", exc)
                await asyncio.sleep(0.5)
            else:
                round_ok(log, "dispatch round failed")

    async def drain(self, timeout: float) -> None:
        """Let hand-offs already under way finish (graceful shutdown)."""
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=timeout)

    async def hand_back(self) -> list[Claimed]:
        """Cancel hand-offs still under way after :meth:`drain`; their claimed tasks (the
        caller requeues those still dispatching)."""
        left = [t for t in self._inflight if not t.done()]
        claims = [c for t in left for c in self._claims.get(t, [])]
        await cancel_and_wait(left, timeout=1.0)
        return claims

    async def dispatch_round(self) -> None:
        """Plan the queues our GPUs serve together; split each other queue in turn."""
        if not self._keyed:  # the first round (retried until it succeeds)
            moved = await self.rt.store.keep_by_key(self.rt.config.queues())
            if moved:
                log.warning("%d queue(s) written before issue 37 now kept by key", moved)
            self._keyed = True
        loads = await self._loads()
        if self._planned():
            loads = await self._plan_round(loads)
        internal = self._internal_shares(loads)
        elsewhere = self._internal_shares(loads, elsewhere=True)
        spare = 0
        for i, load in enumerate(loads):
            if load.backlog <= 0:
                continue
            served = self.internal is not None and load.platform in self.internal.serves
            share = internal[i] + (spare if served else 0)
            taken = await self._dispatch(load, self._split(load, share, elsewhere[i]))
            if served:
                spare = share - min(len(taken), share)

    def _planned(self) -> bool:
        """Whether this round plans the internal target's queues (it is ours first)."""
        return self.internal is not None and self.internal.preferred

    async def _plan_round(self, loads: list[QueueLoad]) -> list[QueueLoad]:
        """Plan and claim the internal target's queues together; the loads of the other
        queues."""
        target = self.internal
        assert target is not None
        rest = [q for q in loads if q.platform not in target.serves]
        busy = {(q.aigc, q.platform): q for q in loads if q not in rest and q.backlog > 0}
        settings = self.rt.settings
        free = capped(target.free_slots(), settings.internal_capacity_max)
        rooms = {key: self._paid_room(q) for key, q in busy.items()}
        if not busy or (free <= 0 and not any(rooms.values())):
            return rest  # nothing can be claimed (the sweep expires what is past its start)
        # the users the places of this round go to (and who is next); if the plan gave our
        # GPUs tasks no free instance can run (node classes, models) while users were left
        # unread, those places are planned again over every ready key (a project at its
        # ``max`` or a user at its limit is given no place, so it costs no second read)
        users = max(free, 0) + sum(rooms.values()) + 1
        left, truncated = await self._plan_and_claim(target, busy, free, rooms, users)
        if left > 0 and truncated:
            await self._plan_and_claim(target, busy, left, dict.fromkeys(rooms, 0), 0)
        return rest

    async def _plan_and_claim(
        self,
        target: InternalTarget,
        busy: dict[Queue, QueueLoad],
        free: int,
        rooms: dict[Queue, int],
        users_max: int,
    ) -> tuple[int, bool]:
        """Read the window (the ready keys of ``users_max`` users per queue, 0: all), plan
        ``free`` slots and the paid ``rooms``, and claim: the free slots no task was
        claimed for though the plan gave them a task, and whether the window left users
        unread."""
        settings = self.rt.settings
        room = sum(rooms.values())
        window = await self.rt.store.reads.window(
            list(busy),
            key_head(settings, free, room),
            target.name,
            dated=RESCUE_MAX,
            busy_max=BUSY_MAX if room else 0,
            user_limit=settings.user_max_running,
            users_max=users_max,
            by_rank=not settings.shares,
        )
        now = time.time()

        def planned(elsewhere: int) -> tuple[fair.Inputs, Decision]:
            given = fair.inputs(
                window,
                free=free,
                free_elsewhere=capped(elsewhere, settings.internal_capacity_max),
                settings=settings,
                keys=self.rt.store.keys,
                now=now,
                projects=self.rt.config.shares,
                booting_s=[max(at - now, 0.0) for at in self.booting()],
            )
            plan = plan_round(given.tasks, given.pool, given.shares, rooms, now, tuning)
            return given, plan

        tuning = fair.tuning(settings)
        elsewhere = target.free_elsewhere()
        given, decision = planned(elsewhere)
        if any(decision.paid.values()):  # pay only against the others' latest word
            fresh = await target.fresh_elsewhere()
            if fresh > elsewhere:
                given, decision = planned(fresh)
        # one pipelined write for all of them (the mux batches a turn's calls)
        await asyncio.gather(*(self.deadlines.start_missed(t) for t in decision.expired))
        if decision.recheck_at is not None:
            self._wake_in(max(decision.recheck_at - now, 0.0))
        unclaimed = await self._claim_planned(
            target, busy, decision, {t.task_id: t for t in given.tasks}
        )
        return unclaimed, window.truncated

    def _paid_room(self, load: QueueLoad) -> int:
        """How many more tasks the queue's paid platform takes now (none while its account
        is paused)."""
        if not load.paid or load.cap <= 0 or load.paid_paused:
            return 0
        return max(load.cap - load.paid_running, 0)

    async def _claim_planned(
        self,
        target: InternalTarget,
        loads: dict[Queue, QueueLoad],
        decision: Decision,
        tasks: dict[str, Waiting],
    ) -> int:
        """Claim what ``decision`` says, queue by queue: the internal grants through the
        target's ``choose`` among the queue's tasks in the plan's order, then those it
        sends to the paid platform (a granted task no free instance can run leaves its
        slot to the next that one can; slots a queue's tasks could not use go to the next
        queue), then the paid ones it did not take. Nothing is charged here: a run on our
        GPUs charges its project and user when it starts (``mark_running.lua``), corrected
        to its real run time when it ends. Returns how many of the places the plan gave
        our GPUs no task could take (no free instance could run one)."""
        order: dict[Queue, list[str]] = {key: [] for key in loads}
        for task_id in decision.order:
            order[tasks[task_id].queue].append(task_id)
        limit = self.rt.settings.user_max_running
        spare = 0
        for key, load in loads.items():
            paid = decision.paid.get(key, [])
            n = len(decision.internal.get(key, [])) + spare
            split = Plan(n, len(paid), 0)
            among = order[key] + paid  # a task it cannot run now leaves its slot to the next
            taken = (
                await self._claim_internal(target, load, split, among, user_limit=limit)
                if n
                else []
            )
            spare = n - min(len(taken), n)
            gone = {c.task_id for c in taken}
            paid = [i for i in paid if i not in gone]
            if paid and load.paid:
                rescued = {i for i in paid if i in tasks and tasks[i].start_by is not None}
                claimed = await self.lifecycle.claim(
                    load.aigc,
                    load.platform,
                    load.paid,
                    cap=load.cap,
                    n=len(paid),
                    ids=paid,
                    why=_reason(rescued),
                )
                for c in claimed:
                    self._spawn(self._hand_over(self.paid, load.aigc, load.platform, [c]), [c])
        return spare

    async def _loads(self) -> list[QueueLoad]:
        """Every configured queue's backlog and paid in-flight count, and the pauses, in
        one pipeline; the queues of paused projects are left out."""
        queues = self.rt.config.queues()
        keys = self.rt.store.keys
        paid = [self.paid.adapter_for(platform) for _, platform in queues]
        names = [adapter.name if adapter else "" for adapter in paid]
        counts = await self.rt.store.mux.commands(
            *(
                cmd
                for (aigc, platform), name in zip(queues, names, strict=True)
                for cmd in (
                    ["ZCARD", keys.wait(aigc, platform)],
                    ["ZCARD", keys.running(aigc, name or "-")],
                    ["ZCARD", keys.orphans(aigc, name or "-")],
                )
            ),
            ["HGETALL", keys.pauses],
        )
        await self._pauses(Paused.of(parse(counts[-1])))
        return [
            QueueLoad(
                aigc,
                platform,
                backlog=int(counts[3 * i]),
                paid=names[i],
                cap=self.paid.cap(aigc, platform),
                paid_running=int(counts[3 * i + 1]) + int(counts[3 * i + 2]),
                paid_paused=bool(names[i])
                and self.paused.account(self.rt, aigc, platform, names[i]),
            )
            for i, (aigc, platform) in enumerate(queues)
            if aigc not in self.paused.projects
        ]

    async def _pauses(self, paused: Paused) -> None:
        """The pauses this round decides by; the internal target hears of new drains."""
        drains_changed = paused.bridges != self.paused.bridges
        self.paused = paused
        if drains_changed and self.on_drains is not None:
            await self.on_drains(paused.bridges)

    def _split(self, load: QueueLoad, internal: int, elsewhere: int) -> Plan:
        """How many of the queue's waiting tasks go internal and to its paid platform."""
        paid_free = self._paid_room(load)
        backlog = min(load.backlog, BATCH)
        if self._internal_preferred(load.platform):
            return plan(backlog, internal, paid_free, elsewhere)
        # paid first, internal takes what it has no room for
        swapped = plan(backlog, max(paid_free, 0), internal)
        return Plan(swapped.external, swapped.internal, swapped.waiting)

    async def _dispatch(self, load: QueueLoad, split: Plan) -> list[Claimed]:
        """Claim and hand over what ``split`` says, from the lowest ranked ready key; what
        the internal target took."""
        aigc, platform = load.aigc, load.platform
        taken: list[Claimed] = []
        if self.internal is not None and platform in self.internal.serves:
            taken = await self._claim_internal(self.internal, load, split, None)
        if split.external and load.paid:
            why = "overflow" if self._internal_preferred(platform) else "paid first"
            claimed = await self.lifecycle.claim(
                aigc, platform, load.paid, cap=load.cap, n=split.external, why=why
            )
            for c in claimed:
                self._spawn(self._hand_over(self.paid, aigc, platform, [c]), [c])
        return taken

    async def _claim_internal(
        self,
        target: InternalTarget,
        load: QueueLoad,
        split: Plan,
        ids: list[str] | None,
        *,
        user_limit: int = 0,
    ) -> list[Claimed]:
        """The tasks the internal target takes: ``split.internal`` from the head (or of
        ``ids``), or those it chooses (:meth:`InternalTarget.choose`, among ``ids`` if
        given; with room on the paid platform for what it hands back beyond the
        ``split.external`` claimed for it next). What was claimed (at most
        ``split.internal`` slots taken). ``user_limit``: an end user's most tasks on it
        (checked inside the claim, with ``ids``)."""
        aigc, platform = load.aigc, load.platform
        paid_free = None
        if load.paid and load.cap > 0:  # a paused account has no room: what needs it waits
            paid_free = 0 if load.paid_paused else load.cap - load.paid_running - split.external
            paid_free = max(0, paid_free)
        chosen = await target.choose(aigc, platform, split.internal, paid_free=paid_free, among=ids)
        if chosen is None:
            claimed = await self.lifecycle.claim(
                aigc,
                platform,
                target.name,
                cap=-1,
                n=split.internal,
                ids=ids,
                user_limit=user_limit,
                why=f"own GPU ({target.name})",
            )
        else:
            if chosen.wake_in_s is not None:
                self._wake_in(chosen.wake_in_s)
            claimed = await self.lifecycle.claim(
                aigc,
                platform,
                target.name,
                cap=-1,
                n=len(chosen.ids),
                ids=chosen.ids,
                user_limit=user_limit,
                why=f"own GPU ({target.name})",
            )
        if claimed:
            self._spawn(self._hand_over(target, aigc, platform, claimed), claimed)
        return claimed

    async def _hand_over(
        self, target: Target, aigc: str, platform: str, tasks: list[Claimed]
    ) -> None:
        for back in await target.hand_over(aigc, platform, tasks):
            await self._handed_back(target, aigc, platform, back)

    async def _handed_back(self, source: Target, aigc: str, platform: str, back: HandBack) -> None:
        """A task the internal target could not place: to the paid platform once it has
        waited long enough (and one serves its queue), else it waits again or fails."""
        c = back.task
        if may_overflow(time.time() - c.created_at, back.overflow_after_s):
            if self._paid_paused(aigc, platform):  # it waits, for as long as the pause lasts
                reason = f"its paid account is paused; {back.reason}"
                await self.lifecycle.held(c, reason, delay_s=back.wait_s or HELD_RECHECK_S)
                return
            moved = await self.paid.take_over(aigc, platform, c, source.name, back.reason)
            if moved > 0:
                self._spawn(self._hand_over(self.paid, aigc, platform, [c]), [c])
            if moved != -2:
                return
        if back.unrunnable is not None:
            u = back.unrunnable
            await self.lifecycle.unrunnable(c.task_id, u.code, u.message, u.detail)
        else:
            await self.lifecycle.not_run(c.task_id, c.attempt, back.reason, delay_s=back.wait_s)

    def _paid_paused(self, aigc: str, platform: str) -> bool:
        adapter = self.paid.adapter_for(platform)
        return adapter is not None and self.paused.account(self.rt, aigc, platform, adapter.name)

    def _internal_shares(self, loads: list[QueueLoad], *, elsewhere: bool = False) -> list[int]:
        """Internal slots per queue (ours, or with ``elsewhere`` those other processes
        hold): round-robin across AIGC projects sharing a platform."""
        shares = [0] * len(loads)
        if self.internal is None:
            return shares
        eligible = [i for i, load in enumerate(loads) if load.platform in self.internal.serves]
        demands = [min(loads[i].backlog, BATCH) for i in eligible]
        slots = self.internal.free_elsewhere() if elsewhere else self.internal.free_slots()
        free = capped(slots, self.rt.settings.internal_capacity_max)
        split = share_round_robin(demands, free, next(self._rr))
        for i, n in zip(eligible, split, strict=True):
            shares[i] = n
        return shares

    def _internal_preferred(self, platform: str) -> bool:
        """Internal first (the default), unless the internal target says it is not
        ``preferred`` (the message-dispatcher with ``priority`` false)."""
        if self.internal is None or platform not in self.internal.serves:
            return True
        return self.internal.preferred

    def _wake_in(self, delay_s: float) -> None:
        """Wake in ``delay_s``, unless an earlier wake-up is already planned."""
        loop = asyncio.get_running_loop()
        when = loop.time() + delay_s
        planned = self._recheck
        if planned is None or planned.when() <= loop.time() or planned.when() > when:
            if planned is not None:
                planned.cancel()
            self._recheck = loop.call_at(when, self.wake)

    def _spawn(self, coro: Coroutine[Any, Any, None], claims: list[Claimed]) -> None:
        task = asyncio.ensure_future(coro)
        self._inflight.add(task)
        self._claims[task] = claims
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._claims.pop(task, None)


def _reason(rescued: set[str]) -> Callable[[str], str]:
    """Why a planned task goes to its paid platform (traced): its start deadline, or
    overflow."""
    return lambda task_id: "deadline rescue" if task_id in rescued else "overflow"
