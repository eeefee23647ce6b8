"""The paid platforms (every registered one whose adapter is ``paid``) as one target:
per-account caps, creates.

A queue's platform is served by one adapter (:meth:`PlatformClient.adapter_for`) under the
AIGC project's account (``config/model.json``: apikey, concurrency). The account's cap holds
in the claim script: its running tasks plus the unwanted remote tasks still counted
(orphans). Before each create its intent is recorded (:meth:`PaidRuns.creating`), so a
process that dies while the create is out is known to have one out; what the platform
answers is the lifecycle's to apply. An acceptance is in this process's journal
(:mod:`aigcq.scheduler.journal`) before anything else, so a process that dies before Redis
has it does not forget a task the platform bills; dead processes' journals are replayed.

Before a create, a task's ``maxCost`` is checked where its platform's price is known
(``AIGCQ_OVERFLOW_PRICE``, per unit: the most units the create may be billed for, the
adapter's ``billed_units``): one expected to cost more is not sent. It
waits for internal capacity when an internal target runs its platform, else fails
``MaxCostExceeded``.

A create is sent only within its project's and account's budgets, checked in the step that
records its intent (:mod:`aigcq.scheduler.budgets`): at a limit the task waits for internal
capacity (its project's paid target held) or fails ``BudgetExceeded``.
"""

from __future__ import annotations

import logging
import os
import uuid

from aigcq.domain import Task
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import (
    Accepted,
    Full,
    NotSent,
    PlatformAdapter,
    Rejected,
    SubmitOutcome,
    Uncertain,
)
from aigcq.plumbing.background import every, one_round
from aigcq.queue.store import Begun, Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.budgets import Budgets
from aigcq.scheduler.ends import TaskEnd
from aigcq.scheduler.journal import SCAN_S, AcceptedJournal, Entry, forget
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.paid_runs import PaidRuns
from aigcq.scheduler.routing import capped
from aigcq.scheduler.targets import HandBack
from aigcq.scheduler.traces import sent

log = logging.getLogger(__name__)


class PaidPlatforms:
    """Every configured paid platform account, behind one :class:`Target`."""

    name = "paid"

    def __init__(
        self, rt: Runtime, lifecycle: Lifecycle, *, internal_serves: tuple[str, ...] = ()
    ) -> None:
        self.rt = rt
        self.lifecycle = lifecycle
        self.runs = PaidRuns(lifecycle)
        self.journal = AcceptedJournal(rt.settings.data_dir / "accepted")
        self.budgets = Budgets(rt)
        #: task platforms an internal target runs too: a task priced out of its paid
        #: platform waits for that one, rather than fail
        self.internal_serves = internal_serves

    def adapter_for(self, platform: str) -> PlatformAdapter | None:
        return self.rt.platforms.adapter_for(platform)

    def cap(self, aigc: str, platform: str) -> int:
        """How many tasks of the queue may run on its platform at once (0: none serves it):
        the account's concurrency, within ``AIGCQ_EXTERNAL_CAPACITY_MAX``."""
        account = self.rt.config.account(aigc, platform)
        if account is None or self.adapter_for(platform) is None:
            return 0
        return capped(account.concurrency, self.rt.settings.external_capacity_max)

    async def take_over(
        self, aigc: str, platform: str, c: Claimed, source: str, reason: str
    ) -> int:
        """A task ``source`` handed back moves here in the same attempt: 1 moved (then
        :meth:`hand_over` it), 0 full (it waits), -1 it moved on, -2 no platform serves
        its queue (left as it is)."""
        adapter, cap = self.adapter_for(platform), self.cap(aigc, platform)
        if adapter is None or cap <= 0:
            return -2
        moved = await self.lifecycle.overflowed(
            c, source, adapter.name, cap=cap, reason=reason, queue=(aigc, platform)
        )
        if moved == 0:
            await self.runs.not_sent(c, (aigc, platform), f"{adapter.name} full; {reason}")
        return moved

    async def hand_over(self, aigc: str, platform: str, tasks: list[Claimed]) -> list[HandBack]:
        adapter = self.adapter_for(platform)
        assert adapter is not None, "claimed for a platform no adapter serves"
        for c in tasks:
            await self._create(adapter, aigc, platform, c)
        return []

    async def replay_journals(self) -> None:
        """At start and every :data:`SCAN_S` after: record what dead processes' journals
        hold (creates the platform accepted that Redis may never have heard of)."""
        what = "replaying accepted creates"
        try:
            with one_round(log, what):
                await self.replay_dead()
            await every(SCAN_S, self.replay_dead, log, what)
        finally:
            self.journal.close()

    async def replay_dead(self) -> int:
        """Replay every journal no live process holds; how many entries it held."""
        replayed = 0
        for path, fd, entries in self.journal.dead():
            try:
                for entry in entries:
                    await self._record(entry)
                    log.warning(
                        "task %s: accepted as %s by %s before its process died; recorded now",
                        entry.task_id,
                        entry.remote_id,
                        entry.target,
                        extra=ctx(task=entry.task_id),
                    )
            except BaseException:
                os.close(fd)  # kept, for the next look
                raise
            forget(path, fd)
            replayed += len(entries)
        return replayed

    async def _record(self, e: Entry) -> bool:
        queue, kind = (e.aigc, e.platform), e.kind
        return await self.lifecycle.accepted(
            e, e.remote_id, queue=queue, target=e.target, kind=kind, paid=True
        )

    def task_ended(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        """Nothing is held here: an unwanted remote task is the lifecycle's orphan."""

    async def _create(self, adapter: PlatformAdapter, aigc: str, platform: str, c: Claimed) -> None:
        lifecycle, name = self.lifecycle, adapter.name
        create_id = uuid.uuid4().hex
        gate, refused = self.budgets.gate(aigc, platform, name), []

        async def begin() -> bool:  # the create may be out from here on
            begun = await self.runs.creating(c, create_id, gate=gate)
            if begun.reached:
                refused.append(begun)
            return bool(begun)

        task = c.as_task(aigc, platform, name)
        apikey = self.rt.apikey(aigc, platform)
        queue, kind = (aigc, platform), adapter.kind
        if await self._priced_out(adapter, queue, c, task, apikey):
            return
        hook = self.rt.webhook_url(c.task_id, c.attempt, name)
        with lifecycle.traces.sending(c, name) as span:
            outcome = await self.rt.platforms.submit(adapter, task, apikey, hook, begin=begin)
            sent(span, outcome)
        if refused:
            await self._over_budget(aigc, name, c, refused[0])
            return
        outcome = await self._resent(adapter, task, apikey, hook, outcome)
        match outcome:
            case Accepted(remote_id=remote_id):
                entry = Entry(c.task_id, c.attempt, c.backend_id, remote_id, *queue, name, kind)
                await self._journal(entry)
                await self._record(entry)
                self.journal.done(entry)
                return
            case Uncertain(reason=reason):
                await lifecycle.uncertain(c, queue, kind, reason)
                return
            case Full(reason=reason):
                moved = await self.runs.not_sent(c, queue, f"{name} full: {reason}")
            case NotSent(reason=reason):
                moved = await self.runs.not_sent(c, queue, f"not sent to {name}: {reason}")
            case Rejected(retryable=True) as rej:
                reason = f"{name}: {rej.code} {rej.message}"
                moved = await lifecycle.refused(c, queue, reason, detail=rej.detail)
            case Rejected() as rej:
                error = {"code": rej.code, "message": rej.message, "detail": rej.detail}
                moved = await self.runs.rejected(c, name, error)
        if not moved:  # it moved on while the create was out: free what that kept
            await self.runs.never_created(c, create_id)

    async def _resent(
        self, adapter: PlatformAdapter, task: Task, apikey: str, hook: str, lost: SubmitOutcome
    ) -> SubmitOutcome:
        """A create whose answer was lost (else ``lost`` as it is), sent once more for the
        same attempt, to a platform that cannot create a second task for it (its
        single-use key). Only an acceptance (its task, or the first create's, named)
        settles the doubt."""
        if not isinstance(lost, Uncertain) or not adapter.resend_same_attempt:
            return lost
        again = await self.rt.platforms.submit(adapter, task, apikey, hook)
        if not isinstance(again, Accepted):  # not named: looked up by its labels, if it can
            found = await self.rt.platforms.lookup(adapter, task, apikey)
            if found is None:
                return lost
            again = Accepted(found)
        log.warning(
            "task %s: a create's answer was lost; sent again with its key: %s",
            task.task_id,
            again.remote_id,
            extra=ctx(task=task.task_id),
        )
        return again

    async def _priced_out(
        self, adapter: PlatformAdapter, queue: tuple[str, str], c: Claimed, task: Task, apikey: str
    ) -> bool:
        """Whether the task's expected cost on ``adapter`` is above its ``maxCost`` (then
        nothing is sent: it waits for internal capacity, or fails). False: no price known
        for the platform, no ``maxCost``, or within it. A task the adapter cannot send at
        all (the adapter's ``unsendable``) is held the same way,
        or fails as the platform's refusal would."""
        why = adapter.unsendable(task)
        if why is not None:
            if queue[1] in self.internal_serves:
                delay_s = self.rt.settings.full_backoff_s
                await self.lifecycle.not_run(
                    c.task_id, c.attempt, f"{why}: waits for internal capacity", delay_s=delay_s
                )
            else:
                error = {"code": f"{adapter.name.upper()}_unsendable", "message": why}
                await self.runs.rejected(c, adapter.name, {**error, "detail": None})
            return True
        price = self.rt.settings.overflow_price.get(adapter.name)
        if price is None:
            return False
        limit = await self.rt.store.reads.max_cost(c.task_id)
        expected = round(price * adapter.billed_units(task, apikey), 6)
        if limit is None or expected <= limit:
            return False
        reason = f"expected cost {expected:g} on {adapter.name} is above its maxCost {limit:g}"
        if queue[1] in self.internal_serves:
            delay_s = self.rt.settings.full_backoff_s
            await self.lifecycle.not_run(
                c.task_id, c.attempt, f"{reason}: waits for internal capacity", delay_s=delay_s
            )
        else:
            await self.runs.priced_out(c, reason)
        return True

    async def _over_budget(self, aigc: str, target: str, c: Claimed, begun: Begun) -> None:
        """A budget stopped the create: the task fails, or waits at the head of its queue
        (its attempt given back) while its project's hold keeps the paid target from it."""
        self.budgets.refused(aigc, target, begun)
        if self.budgets.fails(aigc):
            await self.runs.over_budget(c, begun.reached)
        else:
            await self.lifecycle.held(c, f"{begun.reached}: waits", delay_s=0.0)

    async def _journal(self, entry: Entry) -> None:
        """On disk before anything else; a disk that fails is logged (Redis still gets it)."""
        try:
            await self.journal.append(entry)
        except OSError as exc:
            log.error(
                "task %s: accepted as %s, not journaled (%r): a crash before Redis has it "
                "forgets it",
                entry.task_id,
                entry.remote_id,
                exc,
                extra=ctx(task=entry.task_id),
            )
