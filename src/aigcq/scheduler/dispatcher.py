"""Event-driven dispatch: on enqueue, on a freed slot, on a callback — plus a slow sweep.

Each round reads every queue's backlog and in-flight counts in one pipeline, asks
:func:`aigcq.scheduler.routing.plan` how to split each backlog between internal capacity
(bridges) and the external platform, and claims exactly that many tasks atomically.
Caps are enforced inside the claim script, so several processes never exceed them.

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
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import RedisError

from aigcq.domain import ErrorCode
from aigcq.health import Health
from aigcq.observability import metrics
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Accepted, Full, NotSent, PlatformAdapter, Rejected, Uncertain
from aigcq.plumbing.background import cancel_and_wait, round_failed
from aigcq.plumbing.events import progress_event, running_message
from aigcq.queue.store import Claimed
from aigcq.scheduler.outcomes import Outcomes
from aigcq.scheduler.routing import Plan, overflow_ready, plan, share_round_robin
from aigcq.service.runtime import Runtime

log = logging.getLogger(__name__)

BATCH = 256  # most tasks one queue hands out per round
#: waits between tries to record an accepted create while Redis does not answer
MARK_RETRY_S = (0.2, 1.0, 3.0)


class InternalTarget(Protocol):
    """Our own GPUs (bridges): the capacity they offer and how tasks reach them."""

    name: str
    serves: tuple[str, ...]
    #: used before paid platforms (seed 000's rule); False: after them, for what they
    #: have no room for
    preferred: bool

    @property
    def healthy(self) -> bool: ...

    @property
    def health_view(self) -> Health:
        """This process's health state machine for the target (for metrics)."""
        ...

    def free_slots(self) -> int: ...

    def free_elsewhere(self) -> int:
        """Free slots of this target that other aigcq processes hold (0 when every
        process sees the same capacity, as through a message-dispatcher)."""
        ...

    async def assign(self, aigc: str, platform: str, tasks: list[Claimed]) -> None: ...


@dataclass(eq=False)
class Dispatcher:
    rt: Runtime
    outcomes: Outcomes
    internal: InternalTarget | None = None
    _wake: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _inflight: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _rr: itertools.count[int] = field(init=False, default_factory=itertools.count)
    _recheck: asyncio.TimerHandle | None = field(init=False, default=None)
    #: handed-off work
    _claims: dict[asyncio.Task[None], list[Claimed]] = field(init=False, default_factory=dict)
    stopped: bool = field(init=False, default=False)  # graceful shutdown: claim nothing more

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.rt.settings.sweep_interval_s)
            self._wake.clear()
            if self.stopped:
                return
            try:
                await self.dispatch_round()
            except Exception as exc:
                round_failed(log, "dispatch round failed", exc)
                await asyncio.sleep(0.5)

    async def drain(self, timeout: float) -> None:
        """Let submissions already under way finish (graceful shutdown)."""
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
        queues = self.rt.config.queues()
        if not queues:
            return
        keys, store = self.rt.store.keys, self.rt.store
        externals = [self.rt.platforms.adapter_for(platform) for _, platform in queues]
        counts = await store.mux.commands(
            *(
                cmd
                for (aigc, platform), ext in zip(queues, externals, strict=True)
                for cmd in (
                    ["LLEN", keys.wait(aigc, platform)],
                    ["ZCARD", keys.running(aigc, ext.name if ext else "-")],
                    ["ZCARD", keys.orphans(aigc, ext.name if ext else "-")],
                )
            )
        )
        backlogs = [int(c) for c in counts[0::3]]
        # an account's cap also counts the remote tasks we gave up on that still run
        running = [int(a) + int(b) for a, b in zip(counts[1::3], counts[2::3], strict=True)]
        internal = self._internal_shares(queues, backlogs)
        elsewhere = self._internal_shares(queues, backlogs, elsewhere=True)
        for i, (aigc, platform) in enumerate(queues):
            if backlogs[i] == 0:
                continue
            account = self.rt.config.account(aigc, platform)
            ext = externals[i]
            ext_max = self.rt.settings.external_capacity_max
            ext_cap = _capped(account.concurrency, ext_max) if account else 0
            ext_free = ext_cap - running[i] if ext and account else 0
            if self._internal_preferred(platform):
                split = plan(min(backlogs[i], BATCH), internal[i], ext_free, elsewhere[i])
            else:  # external first, internal takes what it has no room for
                swapped = plan(min(backlogs[i], BATCH), max(ext_free, 0), internal[i])
                split = Plan(swapped.external, swapped.internal, swapped.waiting)
            external = split.external
            if external and self._waits_for_internal(platform):
                external = await self._old_enough(aigc, platform, split.internal, external)
            if split.internal and self.internal is not None:
                claimed = await store.claim(
                    aigc,
                    platform,
                    self.internal.name,
                    cap=-1,
                    n=split.internal,
                    deadline_s=self.rt.dispatch_deadline_s,
                )
                if claimed:
                    self._spawn(self.internal.assign(aigc, platform, claimed), claimed)
            if external and ext is not None and account is not None:
                claimed = await store.claim(
                    aigc,
                    platform,
                    ext.name,
                    cap=ext_cap,
                    n=external,
                    deadline_s=self.rt.dispatch_deadline_s,
                )
                for c in claimed:
                    self._spawn(self._submit_external(ext, aigc, platform, c), [c])

    def _internal_shares(
        self, queues: list[tuple[str, str]], backlogs: list[int], *, elsewhere: bool = False
    ) -> list[int]:
        """Internal slots per queue (ours, or with ``elsewhere`` those other processes
        hold): round-robin across AIGC projects sharing a platform."""
        shares = [0] * len(queues)
        if self.internal is None:
            return shares
        eligible = [i for i, (_, p) in enumerate(queues) if p in self.internal.serves]
        demands = [min(backlogs[i], BATCH) for i in eligible]
        slots = self.internal.free_elsewhere() if elsewhere else self.internal.free_slots()
        free = _capped(slots, self.rt.settings.internal_capacity_max)
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

    async def overflow(self, aigc: str, platform: str, c: Claimed, reason: str) -> bool:
        """A task claimed for the internal target that none of its instances able to run it
        can take (none has every node class and model file its workflow names, or those are
        busy): to the queue's external platform in the same attempt, within its cap (full:
        it waits, after a back-off). False: no external platform serves the queue."""
        ext = self.rt.platforms.adapter_for(platform)
        account = self.rt.config.account(aigc, platform)
        cap = _capped(account.concurrency, self.rt.settings.external_capacity_max) if account else 0
        if ext is None or account is None or cap <= 0 or self.internal is None:
            return False
        moved = await self.rt.store.retarget(
            c.task_id,
            c.attempt,
            self.internal.name,
            ext.name,
            cap=cap,
            deadline_s=self.rt.dispatch_deadline_s,
        )
        log.info(
            "task %s: to %s (%s): %s",
            c.task_id,
            ext.name,
            {1: "sent", 0: "full, waits"}.get(moved, "moved on"),
            reason,
            extra=ctx(task=c.task_id),
        )
        if moved > 0:
            self._spawn(self._submit_external(ext, aigc, platform, c), [c])
        elif moved == 0:
            await self._requeue_unrun(c, aigc, platform, f"{ext.name} full; {reason}")
        return True

    async def _submit_external(
        self, adapter: PlatformAdapter, aigc: str, platform: str, c: Claimed
    ) -> None:
        rt = self.rt
        account = rt.config.account(aigc, platform)
        task = c.as_task(aigc, platform, adapter.name)
        hook = rt.webhook_url(c.task_id, c.attempt)
        create_id = uuid.uuid4().hex

        async def begin() -> bool:  # the create may be out from here on
            deadline = rt.dispatch_deadline_s
            return await rt.store.begin_create(c.task_id, c.attempt, create_id, deadline_s=deadline)

        apikey = account.apikey if account else ""
        outcome = await rt.platforms.submit(adapter, task, apikey, hook, begin=begin)
        deadline_s = rt.deadline_s(account)
        match outcome:
            case Accepted(remote_id=remote_id):
                metrics.overflowed(aigc, platform, adapter.name, rt.settings.overflow_price)
                await self._accepted(adapter, aigc, platform, c, remote_id, deadline_s)
            case Uncertain(reason=reason):
                log.warning(
                    "task %s: submit uncertain (%s); awaiting webhook",
                    c.task_id,
                    reason,
                    extra=ctx(task=c.task_id),
                )
                await rt.store.mark_running(
                    c.task_id, c.attempt, "", deadline_s=deadline_s, kind=adapter.kind
                )
            case Full(reason=reason):
                await self._requeue_unrun(c, aigc, platform, f"{adapter.name} full: {reason}")
            case NotSent(reason=reason):
                reason = f"not sent to {adapter.name}: {reason}"
                await self._requeue_unrun(c, aigc, platform, reason)
            case Rejected(retryable=True) as rej:
                reason = f"{adapter.name}: {rej.code} {rej.message}"
                await self.outcomes.retry_claimed(c, aigc, platform, reason, detail=rej.detail)
            case Rejected() as rej:
                error = {"code": rej.code, "message": rej.message, "detail": rej.detail}
                await self.outcomes.fail(
                    c.task_id,
                    c.attempt,
                    ErrorCode.TASK_FAILED,
                    error,
                    f"{adapter.name} rejected: {rej.code}",
                    ended=True,
                )
                log.warning(
                    "task %s: rejected by %s: %s",
                    c.task_id,
                    adapter.name,
                    rej,
                    extra=ctx(task=c.task_id),
                )

    async def _accepted(
        self,
        adapter: PlatformAdapter,
        aigc: str,
        platform: str,
        c: Claimed,
        remote_id: str,
        deadline_s: float,
    ) -> None:
        """Record the remote task; one accepted for an attempt that moved on meanwhile (a
        cancel, an older attempt's success) is cancelled, and counted until it ends."""
        rt = self.rt
        for wait_s in (*MARK_RETRY_S, None):
            try:
                marked = await rt.store.mark_running(
                    c.task_id,
                    c.attempt,
                    remote_id,
                    deadline_s=deadline_s,
                    kind=adapter.kind,
                    progress=progress_event(c.backend_id, running_message(c.task_id, adapter.name)),
                    where=(aigc, platform, adapter.name) if adapter.paid else None,
                )
                break
            except RedisError as exc:  # the create is out: keep trying to record it
                if wait_s is None:
                    raise  # the sweeper finds the create recorded and waits for the webhook
                log.warning(
                    "task %s: accepted as %s, not recorded yet: %s",
                    c.task_id,
                    remote_id,
                    exc,
                    extra=ctx(task=c.task_id),
                )
                await asyncio.sleep(wait_s)
        if marked.orphaned:
            orphan = await rt.store.orphans_of(remote_id)
            if orphan is not None:
                await self.outcomes.orphans.cancel(orphan)

    async def _requeue_unrun(self, c: Claimed, aigc: str, platform: str, reason: str) -> None:
        """Back to waiting, after a back-off, without using an attempt (the platform ran
        nothing) — while the task has such free requeues left; then it uses attempts."""
        rt = self.rt
        if c.uncharged >= rt.store.free_requeues:
            await self.outcomes.retry_claimed(c, aigc, platform, reason)
            return
        await rt.store.requeue_unrun(
            c.task_id, c.attempt, reason, delay_s=rt.settings.full_backoff_s
        )


def _capped(capacity: int, cap: int) -> int:
    """``capacity`` limited to ``cap`` (seed 000 §3.7 ``*_CAPACITY_MAX``; 0 = no cap): the
    internal free slots one round considers, a queue's external tasks in flight."""
    return min(capacity, cap) if cap > 0 else capacity
