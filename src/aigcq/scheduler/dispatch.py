"""The dispatch loop: plan and claim, on events (enqueue, a freed slot, a callback) and a
slow sweep.

Each round reads every queue's backlog and in-flight counts in one pipeline, asks
:func:`aigcq.scheduler.routing.plan` how to split each backlog between the internal target
(bridges, or a message-dispatcher) and the queue's paid platform, claims exactly that many
tasks atomically and hands them over (:mod:`aigcq.scheduler.targets`). Caps are enforced
inside the claim script, so several processes never exceed them. A task the internal
target hands back goes to the paid platform in the same attempt, or waits again.

The internal target reports no free slots while its health is not ``healthy``, so tasks
overflow at once then. With ``overflow_after_ms`` > 0 and internal healthy, a task goes
external only once it has waited that long (from its ``created`` time).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aigcq.plumbing.background import round_failed, round_ok
from aigcq.plumbing.cancel import cancel_and_wait
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.paid import PaidPlatforms
from aigcq.scheduler.routing import (
    Plan,
    capped,
    may_overflow,
    overflow_ready,
    plan,
    share_round_robin,
)
from aigcq.scheduler.targets import HandBack, InternalTarget, Target

log = logging.getLogger(__name__)

BATCH = 256  # most tasks one queue hands out per round


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


@dataclass(eq=False)
class DispatchLoop:
    rt: Runtime
    lifecycle: Lifecycle
    paid: PaidPlatforms
    internal: InternalTarget | None = None
    #: set by whoever frees capacity or queues work: a round runs soon after
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _inflight: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _rr: itertools.count[int] = field(init=False, default_factory=itertools.count)
    _recheck: asyncio.TimerHandle | None = field(init=False, default=None)
    #: handed-off work
    _claims: dict[asyncio.Task[None], list[Claimed]] = field(init=False, default_factory=dict)
    stopped: bool = field(init=False, default=False)  # graceful shutdown: claim nothing more

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
        loads = await self._loads()
        internal = self._internal_shares(loads)
        elsewhere = self._internal_shares(loads, elsewhere=True)
        for i, load in enumerate(loads):
            if load.backlog > 0:
                await self._dispatch(load, self._split(load, internal[i], elsewhere[i]))

    async def _loads(self) -> list[QueueLoad]:
        """Every configured queue's backlog and paid in-flight count, in one pipeline."""
        queues = self.rt.config.queues()
        if not queues:
            return []
        keys = self.rt.store.keys
        paid = [self.paid.adapter_for(platform) for _, platform in queues]
        names = [adapter.name if adapter else "" for adapter in paid]
        counts = await self.rt.store.mux.commands(
            *(
                cmd
                for (aigc, platform), name in zip(queues, names, strict=True)
                for cmd in (
                    ["LLEN", keys.wait(aigc, platform)],
                    ["ZCARD", keys.running(aigc, name or "-")],
                    ["ZCARD", keys.orphans(aigc, name or "-")],
                )
            )
        )
        return [
            QueueLoad(
                aigc,
                platform,
                backlog=int(counts[3 * i]),
                paid=names[i],
                cap=self.paid.cap(aigc, platform),
                paid_running=int(counts[3 * i + 1]) + int(counts[3 * i + 2]),
            )
            for i, (aigc, platform) in enumerate(queues)
        ]

    def _split(self, load: QueueLoad, internal: int, elsewhere: int) -> Plan:
        """How many of the queue's waiting tasks go internal and to its paid platform."""
        paid_free = load.cap - load.paid_running if load.cap > 0 else 0
        backlog = min(load.backlog, BATCH)
        if self._internal_preferred(load.platform):
            return plan(backlog, internal, paid_free, elsewhere)
        # paid first, internal takes what it has no room for
        swapped = plan(backlog, max(paid_free, 0), internal)
        return Plan(swapped.external, swapped.internal, swapped.waiting)

    async def _dispatch(self, load: QueueLoad, split: Plan) -> None:
        aigc, platform = load.aigc, load.platform
        external = split.external
        if external and self._waits_for_internal(platform):
            external = await self._old_enough(aigc, platform, split.internal, external)
        if split.internal and self.internal is not None:
            target = self.internal
            claimed = await self.lifecycle.claim(
                aigc, platform, target.name, cap=-1, n=split.internal
            )
            if claimed:
                self._spawn(self._hand_over(target, aigc, platform, claimed), claimed)
        if external and load.paid:
            claimed = await self.lifecycle.claim(
                aigc, platform, load.paid, cap=load.cap, n=external
            )
            for c in claimed:
                self._spawn(self._hand_over(self.paid, aigc, platform, [c]), [c])

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

    def _waits_for_internal(self, platform: str) -> bool:
        """Overflow of ``platform`` waits ``overflow_after_ms`` for a healthy internal target."""
        return (
            self._internal_preferred(platform)
            and self.rt.settings.overflow_after_ms > 0
            and self.internal is not None
            and platform in self.internal.serves
            and self.internal.healthy
        )

    async def _old_enough(self, aigc: str, platform: str, skip: int, n: int) -> int:
        """How many of the ``n`` tasks after the first ``skip`` (which go internal) have
        waited long enough to overflow; plans a wake-up for when the next one has."""
        keys, redis = self.rt.store.keys, self.rt.redis
        ids = await redis.lrange(keys.wait(aigc, platform), skip, skip + n - 1)
        pipe = redis.pipeline(transaction=False)
        for task_id in ids:
            pipe.hget(keys.task(str(task_id)), "created")  # decode_responses: already str
        now = time.time()
        waited = [now - float(created or now) for created in await pipe.execute()]
        after_s = self.rt.settings.overflow_after_ms / 1000
        ready = overflow_ready(waited, after_s)
        if ready < len(waited):
            self._wake_in(after_s - waited[ready])
        return ready

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
