"""Watching unwanted remote tasks until their platform says they ended (see :mod:`.orphans`).

Each check asks the platform; a result, a failure or "not found" frees the account's slot,
anything else cancels again and asks later (except the run of an attempt whose task failed
``UncertainSubmit`` for want of its create's reply: ``awaited``, its success still wins).
A run that ended with a result or a failure was billed all the same: it is charged
(:mod:`.spend`) by the check that frees its slot. A create with no remote id cannot be
asked: it is counted until its reply, its webhook, the platform's word that the account
runs nothing (RunningHub's ``accountStatus``), or the platform's maximum run time.

The checks run in a loop of their own (a slow platform must not hold up the sweeper's
back-offs and deadlines), a bounded batch at a time; a check that fails (the platform
unreachable, a bug) is asked again later with back-off, and the others still go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Failed, NotFound, Succeeded
from aigcq.plumbing.background import REDIS_OUTAGE, every
from aigcq.queue.store import Orphan
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.orphans import as_task
from aigcq.scheduler.paid_runs import PaidRuns

log = logging.getLogger(__name__)

#: seconds between two checks of one orphan
RECHECK_S = 2.0
#: longest wait after checks of one orphan that failed
MAX_FAILED_BACKOFF_S = 60.0
#: orphans checked at once
BATCH = 20
#: failing orphans whose back-off this process remembers at most
KEPT_FAILURES = 10_000


@dataclass(eq=False)
class OrphanChecks:
    """Every account's unwanted remote tasks, asked about until they end."""

    rt: Runtime
    lifecycle: Lifecycle
    #: remote id -> checks in a row that failed (for their back-off; this process's view)
    _failures: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.paid_runs = PaidRuns(self.lifecycle)

    async def run(self) -> None:
        await every(self.rt.settings.sweep_interval_s, self.check_due, log, "orphan checks")

    async def check_due(self) -> int:
        """Ask the platform about every orphan due for a check, ``BATCH`` at a time; the
        number released."""
        released = 0
        for aigc, target in self.rt.paid_accounts():
            due = await self.rt.store.reads.orphans_due(aigc, target)
            for start in range(0, len(due), BATCH):
                batch = due[start : start + BATCH]
                released += sum(await asyncio.gather(*(self._check_or_later(o) for o in batch)))
        return released

    async def _check_or_later(self, o: Orphan) -> int:
        try:
            released = await self._check(o)
        except Exception as exc:
            if len(self._failures) >= KEPT_FAILURES:  # released elsewhere meanwhile: forget
                self._failures.clear()
            failures = self._failures[o.remote_id] = self._failures.get(o.remote_id, 0) + 1
            delay = min(RECHECK_S * 2**failures, MAX_FAILED_BACKOFF_S)
            log.warning(
                "task %s: check of unwanted remote task %s failed (%r); again in %.0f s",
                o.task_id,
                o.remote_id,
                exc,
                delay,
                exc_info=not isinstance(exc, REDIS_OUTAGE),
                extra=ctx(task=o.task_id),
            )
            await self.paid_runs.orphan_unresolved(o, delay)
            return 0
        self._failures.pop(o.remote_id, None)
        return released

    async def _check(self, o: Orphan) -> int:
        adapter = self.rt.platforms.adapters.get(o.target)
        if adapter is None:
            return int(await self.paid_runs.orphan_ended(o))
        if o.awaiting_create:
            return await self._check_create(o)
        # peek: inline files are not stored (such a result is not kept for a replay)
        outcome = await self.rt.platforms.peek(
            adapter, as_task(o), self.rt.apikey(o.aigc, o.platform)
        )
        if isinstance(outcome, Succeeded | Failed | NotFound):
            log.info(
                "task %s: unwanted remote task %s ended (%s)",
                o.task_id,
                o.remote_id,
                type(outcome).__name__,
                extra=ctx(task=o.task_id),
            )
            kept = outcome.data if isinstance(outcome, Succeeded) and not outcome.files else None
            billed = outcome if not isinstance(outcome, NotFound) else None
            return int(await self.paid_runs.orphan_ended(o, kept, billed))
        if not o.awaited:  # (an awaited one's success still wins: let it run)
            await self.lifecycle.orphans.cancel(o)  # still running (or no answer): ask again
        await self.paid_runs.orphan_unresolved(o, RECHECK_S)
        return 0

    async def _check_create(self, o: Orphan) -> int:
        """A create with no remote id: the platform cannot be asked about it, so it is
        counted until the platform says the account runs nothing at all (once the create's
        request is surely over), or the longest a task runs there
        (``AIGCQ_PAID_MAX_RUN_S``) has passed since the create, unless its reply or
        webhook resolved it first. Not the task's deadline: the task may have been sent
        again at that deadline while this create still runs."""
        max_run_s = self.rt.max_run_s(o.target)
        left = o.create_at + max_run_s - time.time()
        if left > 0 and not await self._runs_nothing(o):
            await self.paid_runs.orphan_unresolved(o, min(left, RECHECK_S))
            return 0
        why = "its account runs nothing" if left > 0 else f"not resolved in {max_run_s:.0f} s"
        log.warning(
            "task %s: the create of attempt %s is over (%s); its slot is free again",
            o.task_id,
            o.attempt,
            why,
            extra=ctx(task=o.task_id),
        )
        return int(await self.paid_runs.orphan_ended(o))

    async def _runs_nothing(self, o: Orphan) -> bool:
        """The platform says the account runs no task, asked only once the create's
        request is over (one still on its way would not be counted yet)."""
        if time.time() < o.create_at + self.rt.dispatch_deadline_s:
            return False
        adapter = self.rt.platforms.adapters[o.target]
        return await self.rt.platforms.running(adapter, self.rt.apikey(o.aigc, o.platform)) == 0
