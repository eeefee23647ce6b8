"""A task's life, from its submit to its end: the one owner of task policy.

Outside :mod:`aigcq.queue` only this module calls the store's write methods. Each method
is named by the event that happened (a target accepted a task, refused it, lost it; a
result came; a client cancelled; a deadline passed …) and does everything that event
means: the store's atomic move, cancelling what the move left unwanted (an orphan on a
paid platform), the log line, the count, and the announcement of a task's end to the
subscribers (the targets: bridges free the slot, stop a cancelled run).

Every report names the attempt it came from: a failure of an attempt that is no longer
the live one changes nothing (checked inside the finishing script); a success of an older
one still wins, and the live attempt's remote task is then cancelled
(:mod:`aigcq.scheduler.orphans`). Longer than 400 lines on purpose, like the store: every
decision about a task is read here, in the order of a task's life.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

from redis.exceptions import RedisError

from aigcq.delivery.custody import Custody
from aigcq.domain import AS_SUBMITTED, ErrorCode, Ordering, Task, TaskState
from aigcq.observability import metrics
from aigcq.observability.jsonlog import say_task
from aigcq.platforms.base import Failed, ResultOutcome, Succeeded
from aigcq.plumbing.events import progress_event, running_message
from aigcq.queue.store import (
    Claimed,
    MoveResult,
    NotReplicated,
    Retried,
    Submitted,
)
from aigcq.runtime import Runtime
from aigcq.scheduler.ends import (
    INFRASTRUCTURE,
    EndListener,
    SlotElsewhere,
    TaskEnd,
    end_of,
    failure_class,
)
from aigcq.scheduler.orphans import Orphans
from aigcq.scheduler.spend import SpendLedger, due_cost
from aigcq.scheduler.traces import TaskTraces

log = logging.getLogger(__name__)


_say = functools.partial(say_task, log)  # one line about a task


def said_late(task_id: str, target: str, attempt: int | None) -> None:
    """A success of ``attempt`` on ``target`` won over the task's ``UncertainSubmit``."""
    _say(
        logging.WARNING,
        task_id,
        "attempt %s's result on %s came after it failed UncertainSubmit: sent to its "
        "client as a late success",
        attempt,
        target,
    )


class Dispatched(Protocol):
    """A task as a target holds it while it is being handed over."""

    @property
    def task_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def backend_id(self) -> str: ...


#: waits between tries to record an accepted paid create while Redis does not answer
#: (the last one repeats for as long as the process lives: the create is billed)
MARK_RETRY_S = (0.2, 1.0, 3.0)


def _mark_waits(paid: bool) -> Iterator[float | None]:
    """The waits before each next try of recording an acceptance; ``None``: no more tries
    (a paid one is tried until it is recorded)."""
    if not paid:
        yield None
        return
    yield from MARK_RETRY_S
    while True:
        yield MARK_RETRY_S[-1]


#: longest a machine failure's retry waits, out of its queue, for the process holding its
#: bridge to free the slot the failed attempt took (see :meth:`Lifecycle.released`)
RELEASE_WAIT_S = 2.0


class Lifecycle:
    def __init__(
        self, rt: Runtime, *, retry_failures: bool = False, custody: Custody | None = None
    ) -> None:
        self.rt = rt
        self.orphans = Orphans(rt)
        self.spend = SpendLedger(rt)
        #: each task's trace (OpenTelemetry; every method returns at once when it is off)
        self.traces = TaskTraces(rt)
        #: copies a paid result's files into our storage before it is delivered (None: never)
        self.custody = custody
        #: a failed result puts the task back while it has attempts left (the
        #: message-dispatcher's retries, seed 000 §9.3.2); otherwise it fails at once
        self.retry_failures = retry_failures
        self._listeners: list[EndListener] = []
        #: before a machine failure's retry is queued, says whether the slot of the attempt
        #: that failed is freed after it (by the process holding its bridge, this one or
        #: another, when it hears of the end). Then the retry waits out of its queue,
        #: dispatched by no one, until that process has freed the slot, written its free
        #: slots for the others and called :meth:`released` (at most ``RELEASE_WAIT_S``):
        #: queued at once, it was routed while the slot still looked taken, and paid for
        #: on a paid platform (None: no bridges)
        self.slot_freed_later: SlotElsewhere | None = None
        #: a client's cancel is answered once this returns for its task: the process
        #: holding the bridge that runs it has heard of it and counts its slot as stopping
        #: (free within about a second) before it plans what the client submits next;
        #: answered at once, the next task was planned while that slot still looked busy,
        #: and paid for (None: no bridges)
        self.cancel_told: Callable[[str], Awaitable[None]] | None = None

    def subscribe(self, listener: EndListener) -> None:
        """``listener`` hears of every task's end from now on (see :class:`TaskEnd`)."""
        self._listeners.append(listener)

    def announce(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        for listener in self._listeners:
            listener(task_id, target, end, attempt)

    def error_body(self, code: ErrorCode, detail: Any = None) -> dict[str, Any]:
        return {"code": code.value, "msg": self.rt.config.messages.get(code.value), "error": detail}

    # ---- arriving -----------------------------------------------------------------------

    async def submitted(
        self,
        task_id: str,
        queue: tuple[str, str],
        backend_id: str,
        payload: dict[str, Any],
        *,
        deliver: bool,
        max_cost: float | None = None,
        ordering: Ordering = AS_SUBMITTED,
        trace: str | None = None,
    ) -> Submitted:
        """A client submitted a task: stored and queued (an existing id is left as it is).
        ``max_cost``: the most it may cost on a paid platform; ``ordering``: when it runs;
        ``trace``: the client's W3C traceparent, the parent of the task's trace."""
        aigc, platform = queue
        with self.traces.creating(task_id, queue, backend_id, trace) as context:
            result = await self.rt.store.submit(
                task_id,
                aigc=aigc,
                platform=platform,
                backend_id=backend_id,
                payload=payload,
                deliver=deliver,
                max_cost=max_cost,
                ordering=ordering,
                trace=context,
            )
        _say(logging.DEBUG, task_id, "submitted by %s (created=%s)", backend_id, result.created)
        await self.made_durable(task_id, "its submit")
        return result

    async def made_durable(self, task_id: str, what: str) -> None:
        """Every write so far is on ``AIGCQ_REDIS_MIN_REPLICAS`` replicas, else
        :class:`NotReplicated` (not acknowledged: the sender tries again)."""
        if not await self._replicated(task_id, what):
            raise NotReplicated(f"{what} is not on {self.rt.store.min_replicas} replica(s) yet")

    async def _replicated(self, task_id: str, what: str) -> bool:
        if await self.rt.store.replicated():
            return True
        store = self.rt.store
        _say(
            logging.WARNING,
            task_id,
            "%s is not on %d replica(s) within %d ms: not acknowledged",
            what,
            store.min_replicas,
            store.wait_timeout_ms,
        )
        return False

    async def retried_by_operator(self, task_id: str) -> Retried:
        """An operator replays a failed or cancelled task: queued again, unless that could
        pay a platform twice. One whose paid run brought a result after it ended gets that
        result instead (it succeeds, ``kept_result``); one whose paid run may still be out
        is left as it is (``paid_out``: its end may yet bring the result)."""
        done = await self.rt.store.retry(task_id, note="retried by an operator")
        if done.applied:
            _say(logging.INFO, task_id, "retried by an operator")
        elif done.kept_result:
            note = "replayed: the result of its paid run, which came after it ended"
            delivered = await self.rt.store.deliver_kept(task_id, note)
            if delivered.applied:
                _say(logging.INFO, task_id, "replayed with its kept paid result; nothing paid")
            return Retried(delivered.applied, delivered.state, kept_result=True)
        elif done.paid_out:
            _say(logging.INFO, task_id, "not replayed: its paid run %s may be out", done.paid_out)
        return done

    # ---- dispatching ----------------------------------------------------------------------

    async def claim(
        self,
        aigc: str,
        platform: str,
        target: str,
        *,
        cap: int,
        n: int,
        ids: Sequence[str] | None = None,
        user_limit: int = 0,
        why: str | Callable[[str], str] = "",
    ) -> list[Claimed]:
        """Up to ``n`` waiting tasks, for ``target``, while its in-flight count < ``cap``:
        from the head, or those of ``ids`` still waiting (``user_limit``: passing over
        those of an end user with that many claimed for our GPUs); ``why``: the reason of
        the decision (traced)."""
        began = time.time()
        claimed = await self.rt.store.claim(
            aigc,
            platform,
            target,
            cap=cap,
            n=n,
            deadline_s=self.rt.dispatch_deadline_s,
            ids=ids,
            user_limit=user_limit,
        )
        self.traces.claimed((aigc, platform), target, claimed, why or f"to {target}", began)
        return claimed

    async def overflowed(
        self,
        c: Claimed,
        source: str,
        target: str,
        *,
        cap: int,
        reason: str,
        queue: tuple[str, str] = ("", ""),
    ) -> int:
        """A task ``source`` could not place goes to ``target`` in the same attempt, within
        its ``cap``: 1 moved, 0 full (it waits, after a back-off), -1 it moved on."""
        moved = await self.rt.store.retarget(
            c.task_id, c.attempt, source, target, cap=cap, deadline_s=self.rt.dispatch_deadline_s
        )
        _say(
            logging.INFO,
            c.task_id,
            "to %s (%s): %s",
            target,
            {1: "sent", 0: "full, waits"}.get(moved, "moved on"),
            reason,
        )
        if moved == 1:
            self.traces.retargeted(c, queue, source, target, reason)
        return moved

    async def accepted(
        self,
        run: Dispatched,
        remote_id: str,
        *,
        queue: tuple[str, str],
        target: str,
        kind: str,
        paid: bool = False,
        holder: str = "",
    ) -> bool:
        """``target`` took ``run`` (an attempt of a task of ``queue``: AIGC, platform) as
        ``remote_id``: it runs. One accepted for an attempt that moved on meanwhile (a
        cancel, an older attempt's success) is not wanted: False (a paid one is cancelled
        here, and counted until it ends). A paid acceptance is kept trying into Redis for as
        long as it does not answer (the create is billed; a process that dies meanwhile
        has it in its journal, :mod:`aigcq.scheduler.journal`). ``holder``: the bridge that
        acknowledged it, recorded as holding the task in the same step."""
        aigc, platform = queue
        task_id, attempt = run.task_id, run.attempt
        deadline_s = self.rt.deadline_s(self.rt.config.account(aigc, platform))
        progress = progress_event(run.backend_id, running_message(task_id, target))
        where = (aigc, platform, target) if paid else None
        if paid:
            metrics.overflowed(aigc, platform, target)
        for wait_s in _mark_waits(paid):
            try:
                marked = await self.rt.store.mark_running(
                    task_id,
                    attempt,
                    remote_id,
                    deadline_s=deadline_s,
                    kind=kind,
                    progress=progress,
                    where=where,
                    holder=holder,
                    holder_ttl_s=int(deadline_s) + 60,
                )
                break
            except RedisError as exc:
                if wait_s is None:
                    raise
                _say(
                    logging.WARNING, task_id, "accepted as %s, not recorded yet: %s", remote_id, exc
                )
                await asyncio.sleep(wait_s)
        if marked.awaited:
            _say(
                logging.WARNING,
                task_id,
                "its create's reply (%s) came after it failed UncertainSubmit: its result is "
                "awaited and wins",
                remote_id,
            )
        elif marked.orphaned:
            orphan = await self.rt.store.reads.orphans_of(remote_id)
            if orphan is not None:
                await self.orphans.cancel(orphan)
        return marked.running

    async def uncertain(self, c: Claimed, queue: tuple[str, str], kind: str, reason: str) -> None:
        """A create's outcome is unknown (it may have been taken): the task waits as running
        for its webhook, or its deadline (see :mod:`aigcq.scheduler.sweeper`)."""
        _say(logging.WARNING, c.task_id, "submit uncertain (%s); awaiting webhook", reason)
        deadline_s = self.rt.deadline_s(self.rt.config.account(*queue))
        await self.rt.store.mark_running(c.task_id, c.attempt, "", deadline_s=deadline_s, kind=kind)

    async def not_run(
        self, task_id: str, attempt: int, reason: str, *, delay_s: float = 0.0
    ) -> bool:
        """Its target did not run the task: back to the head of its queue, its attempt not
        charged (after ``delay_s``: a back-off, so it is not claimed again in a loop).
        False: the attempt had moved on (a cancel, a retry)."""
        moved = await self.rt.store.requeue_unrun(task_id, attempt, reason, delay_s=delay_s)
        if moved:
            _say(logging.INFO, task_id, "back to waiting (%s)", reason)
            self.traces.attempt_over(task_id, attempt, "not run", error=reason)
        return moved

    async def held(self, c: Claimed, reason: str, *, delay_s: float) -> bool:
        """An operator's pause keeps a claimed task from the one target that would take it
        now: back to waiting after ``delay_s``, its attempt given back however often (a
        pause fails nothing, however long it lasts). False: it had moved on."""
        moved = await self.rt.store.requeue_unrun(
            c.task_id, c.attempt, reason, delay_s=delay_s, held=True
        )
        if moved:
            _say(logging.INFO, c.task_id, "held (%s)", reason)
            self.traces.attempt_over(c.task_id, c.attempt, "held")
        return moved

    async def refused(self, c: Claimed, queue: tuple[str, str], reason: str, **error: Any) -> bool:
        """Its target refused the task (ran nothing): another attempt while the budget
        lasts, else it fails (``error``: the failure's ``code`` and ``detail``)."""
        aigc, platform = queue
        return await self.retry_or_fail(
            c.task_id,
            aigc=aigc,
            platform=platform,
            attempt=c.attempt,
            charged=c.charged,
            reason=reason,
            ended=True,
            **error,
        )

    async def unrunnable(self, task_id: str, code: str, message: str, detail: Any) -> None:
        """No target can run the task (an invalid payload, a workflow nobody knows): it
        fails for its client at once, and no target's health is touched."""
        error = {"code": code, "message": message, "detail": detail}
        done = await self.rt.store.finish(
            task_id,
            TaskState.FAILED,
            error=error,
            message=self.error_body(ErrorCode.TASK_FAILED, error),
            note=f"bridge: {code}",
        )
        if not done.applied:  # it had ended or moved on: that attempt's span is not this one
            return
        _say(logging.WARNING, task_id, "fails, %s: %s (%s)", code, message, detail)
        self.traces.attempt_over(task_id, None, "unrunnable", error=f"{code}: {message}")

    async def lost(self, task_id: str, attempt: int, reason: str) -> None:
        """A bridge no longer holds an acknowledged task (a machine's failure): another
        attempt, at the head of its queue."""
        if await self.rt.store.requeue_for_retry(task_id, attempt, reason):
            self.traces.attempt_over(task_id, attempt, "lost", error=reason)
        _say(logging.WARNING, task_id, "%s, requeued", reason)

    async def taken_back(self, task: Task, remote_id: str, reason: str) -> bool:
        """A message-dispatcher handed a running task back: routed again, while it still
        runs there as ``remote_id``; its attempt is charged (a late TASK_END is refused)."""
        moved = await self.rt.store.requeue_handed_back(
            task.task_id, task.attempt, remote_id, reason
        )
        if moved:
            _say(logging.WARNING, task.task_id, "%s", reason)
            self.traces.attempt_over(task.task_id, task.attempt, "handed back", error=reason)
        return moved

    async def unsent(self, task_id: str, attempt: int, reason: str) -> bool:
        """Claimed here and never sent (this process stopped, or died before it did): back
        to waiting, uncharged, unless a create may be out for it."""
        moved = await self.rt.store.requeue_unsent(task_id, attempt, reason)
        if moved:
            _say(logging.WARNING, task_id, "%s; back to waiting", reason)
            self.traces.attempt_over(task_id, attempt, "not sent", error=reason)
        return moved

    async def withdrawn(self, task_id: str, *, error: dict[str, Any], note: str) -> bool:
        """Its submitter took a waiting task back (no message for its client)."""
        return await self.rt.store.withdraw(task_id, error=error, note=note)

    async def restored(self, task_id: str, note: str) -> None:
        """A withdrawal that did not reach its submitter: the task runs here after all."""
        await self.rt.store.retry(task_id, note=note)

    # ---- ending --------------------------------------------------------------------------

    async def settle(
        self,
        task_id: str,
        outcome: ResultOutcome,
        note: str,
        attempt: int | None = None,
        *,
        target: str = "",
        keep: bool = False,
    ) -> MoveResult | None:
        """A result reported by ``attempt`` (None: not known, e.g. a message-dispatcher's
        report) of a task on ``target``; ``None`` when it says the task is not done. The
        end is announced: applied, or refused as gone (that run is over all the same).
        A success's files are copied first where result custody wants them (on ``target``,
        or, when not known, if ``keep``: it came from a paid target whose files may be)."""
        cost = due_cost(outcome) if isinstance(outcome, Succeeded | Failed) else b""
        match outcome:
            case Succeeded(data=data):
                if self.custody is not None and (target or keep):
                    data = await self.custody.kept(task_id, target, data)
                done = await self.rt.store.finish(
                    task_id,
                    TaskState.SUCCESS,
                    result=data,
                    message={"result": data},
                    note=note,
                    from_attempt=attempt,
                    ended=True,
                    cost=cost,
                )
            case Failed(code=code, message=message, detail=detail):
                error = {"code": code, "message": message, "detail": detail}
                again = outcome.retryable or failure_class(outcome) == INFRASTRUCTURE
                why = f"failed: {code} {message}"
                if await self._retried(task_id, why, attempt, target, again=again, ran=outcome):
                    await self._charge_if_paid(task_id, target)
                    self.announce(task_id, target, end_of(outcome), attempt)
                    return MoveResult(True, TaskState.PENDING)
                done = await self.rt.store.finish(
                    task_id,
                    TaskState.FAILED,
                    error=error,
                    message=self.error_body(ErrorCode.TASK_FAILED, error),
                    note=note,
                    from_attempt=attempt,
                    fenced=attempt is not None,
                    ended=True,
                    cost=cost,
                )
            case _:
                return None
        _say(logging.DEBUG, task_id, "%s via %s (applied=%s)", done.state, note, done.applied)
        if done.late:
            said_late(task_id, done.target or target, attempt)
        await self._cancel_orphan(task_id, done)
        ran_on = done.released or done.target or target  # an orphan's run: where it ran
        if done.applied:
            failure = "" if isinstance(outcome, Succeeded) else f"{outcome.code}: {outcome.message}"
            self.traces.attempt_over(
                task_id, attempt, done.state or "", error=failure, cost=outcome.cost
            )
            await self._charge_if_paid(task_id, ran_on)
            self.announce(task_id, done.target or target, end_of(outcome), attempt)
        elif done.state is not None:
            if done.released:  # a run the task no longer wanted, billed all the same
                await self.spend.charge_due(task_id)
            self.announce(task_id, target, TaskEnd.GONE, attempt)
        return done

    async def cancelled(self, task: Task, *, by_client: bool) -> MoveResult:
        """Its client (or an operator) cancelled a live task: its target is told to stop
        (a paid remote task is cancelled, and counted until it ends)."""
        done = await self.rt.store.finish(
            task.task_id,
            TaskState.CANCELLED,
            message=self.error_body(ErrorCode.TASK_CANCELLED),
            note="cancelled by client" if by_client else "cancelled by admin",
        )
        if not done.applied:
            return done
        if task.attempt and task.state is not TaskState.PENDING:
            self.traces.attempt_over(task.task_id, task.attempt, "cancelled")
        self.announce(task.task_id, task.target, TaskEnd.CANCELLED, task.attempt)
        if by_client and self.cancel_told is not None:  # orders its client's next submit after it
            await self.cancel_told(task.task_id)
        adapter = self.rt.platforms.adapters.get(task.target)
        if done.orphan:
            await self._cancel_orphan(task.task_id, done)
        elif adapter is not None and task.remote_id:
            account = self.rt.config.account(task.aigc, task.platform)
            await self.rt.platforms.cancel(adapter, task, account.apikey if account else "")
        _say(logging.INFO, task.task_id, "cancelled")
        return done

    async def retry_or_fail(
        self,
        task_id: str,
        *,
        aigc: str,
        platform: str,
        attempt: int,
        charged: int,
        reason: str,
        code: ErrorCode = ErrorCode.TASK_TIMEOUT,
        detail: Any = None,
        ended: bool = False,
    ) -> bool:
        """Requeue ``attempt`` for another one while ``charged`` attempts leave budget, or
        fail the task. ``ended``: its remote task is known to be over (else a paid one is
        kept counted and cancelled). True when the task moved."""
        account = self.rt.config.account(aigc, platform)
        if charged < self.rt.max_attempts(account):
            return await self._requeue(
                task_id, attempt, reason, delay_s=min(charged, 10), ended=ended
            )
        error = {"code": code.value, "message": reason, "detail": detail}
        done = await self.fail(task_id, attempt, code, error, reason, ended=ended)
        if done.applied:
            _say(logging.ERROR, task_id, "failed after %s attempts: %s", charged, reason)
        return done.applied

    async def fail(
        self,
        task_id: str,
        attempt: int,
        code: ErrorCode,
        error: dict[str, Any],
        note: str,
        *,
        ended: bool = False,
    ) -> MoveResult:
        """Fail the task while ``attempt`` is its live one; cancel what that leaves
        unwanted (``ended``: its remote task is known to be over)."""
        done = await self.rt.store.finish(
            task_id,
            TaskState.FAILED,
            error=error,
            message=self.error_body(code, error),
            note=note,
            from_attempt=attempt,
            fenced=True,
            ended=ended,
        )
        if done.applied:
            self.traces.attempt_over(task_id, attempt, "failed", error=note)
        await self._cancel_orphan(task_id, done)
        return done

    async def _cancel_orphan(self, task_id: str, done: MoveResult) -> None:
        """Cancel the remote task a finishing move left unwanted (if any)."""
        if not done.orphan:
            return
        found = await self.rt.store.reads.orphans_of(done.orphan)
        if found is not None:
            await self.orphans.cancel(found)
        else:
            _say(logging.DEBUG, task_id, "orphan %s already released", done.orphan)

    async def _charge_if_paid(self, task_id: str, target: str) -> None:
        """The end just applied on ``target`` made its charge due if ``target`` is paid:
        made now (a process that dies first leaves it to the sweep)."""
        adapter = self.rt.platforms.adapters.get(target)
        if adapter is not None and adapter.paid:
            await self.spend.charge_due(task_id)

    async def _retried(
        self,
        task_id: str,
        reason: str,
        attempt: int | None,
        target: str,
        *,
        again: bool,
        ran: Failed | None = None,
    ) -> bool:
        """With ``retry_failures``, or for a failure worth another attempt (``again``: a
        machine's, or one its platform documents as retryable): requeue a failed task
        that has attempts left; at once, unless its slot on ``target`` is freed after
        (see :attr:`slot_freed_later`)."""
        if not (self.retry_failures or again):
            return False
        task = await self.rt.store.reads.get(task_id)
        if task is None or task.state.terminal:
            return False
        if task.charged >= self.rt.max_attempts(self.rt.config.account(task.aigc, task.platform)):
            return False
        live = task.attempt if attempt is None else attempt
        held = self.slot_freed_later
        wait = held is not None and await held(task_id, target or task.target, live)
        if wait:
            _say(logging.INFO, task_id, "its retry waits for its slot to be freed")
        delay_s = RELEASE_WAIT_S if wait else 0.0
        return await self._requeue(task_id, live, reason, delay_s=delay_s, ended=True, ran=ran)

    async def released(self, task_id: str) -> bool:
        """The slot a machine failure's retry waited for is free (see
        :attr:`slot_freed_later`): the retry waits at the head of its queue now. False:
        it was not waiting for it (queued already, or moved on)."""
        moved = await self.rt.store.promote(task_id)
        if moved:
            _say(logging.INFO, task_id, "its slot is free: the retry waits in its queue")
        return moved

    async def _requeue(
        self,
        task_id: str,
        attempt: int,
        reason: str,
        *,
        delay_s: float,
        ended: bool,
        ran: Failed | None = None,
    ) -> bool:
        """Put ``attempt`` back for another one (only while it is the live attempt);
        ``ran``: the failure its run reported (a paid run's charge is due with the move,
        and its span carries what it cost)."""
        cost = due_cost(ran) if ran is not None else b""
        moved = await self.rt.store.requeue_for_retry(
            task_id, attempt, reason, delay_s=delay_s, ended=ended, cost=cost
        )
        if moved:
            _say(logging.WARNING, task_id, "attempt %s %s, retrying", attempt, reason)
            spent = ran.cost if ran is not None else None
            self.traces.attempt_over(task_id, attempt, "retry", error=reason, cost=spent)
        return moved
