"""TaskStore: the only code that writes task state. Each write is one atomic Lua call.

Each write method makes one named move of :data:`aigcq.domain.TRANSITIONS` (the method's
docstring says what happened to the task); the scripts are in ``lua/``, their arguments
declared by name and loaded by :mod:`aigcq.queue.scripts`, the key names in
:mod:`aigcq.queue.keys`.

Longer than 400 lines on purpose: this is the one writer of task state ("One writer of
task state" in the README's architecture section), so every move a task can make is read
here, in one class, next to the records its scripts answer with. Splitting it by concern
would spread the writers over several modules, which is what the rule forbids.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from aigcq.domain import AS_SUBMITTED, TRANSITIONS, ErrorCode, Move, Ordering, Task, TaskState
from aigcq.observability import metrics
from aigcq.platforms.registry import workflow_fields
from aigcq.plumbing.redis_mux import RedisMux
from aigcq.plumbing.text import text
from aigcq.queue import scripts
from aigcq.queue.keys import Keys, outbox_minid
from aigcq.queue.reads import Orphan as Orphan
from aigcq.queue.reads import TaskReads
from aigcq.queue.reads import Window as Window
from aigcq.queue.reads import Windowed as Windowed
from aigcq.queue.reads import run_means as run_means
from aigcq.queue.reads import task_from_hash as task_from_hash


@dataclass(frozen=True, slots=True)
class Submitted:
    created: bool
    state: TaskState
    backend_id: str


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task just moved to DISPATCHING for ``target`` (what the dispatcher needs)."""

    task_id: str
    attempt: int
    payload: dict[str, Any]
    backend_id: str
    workflow_id: str
    created_at: float
    #: attempts charged to the task's budget (``attempt`` counts every dispatch)
    charged: int = 1
    #: requeues so far that gave their attempt back (bounded by ``free_requeues``)
    uncharged: int = 0
    #: its end user (``userId``; "": none)
    user: str = ""
    #: its trace context, a W3C traceparent ("": not traced; :mod:`aigcq.scheduler.traces`)
    trace: str = ""
    #: when it began to wait this time (epoch s: its submit, or its return to waiting)
    since: float = 0.0

    def as_task(self, aigc: str, platform: str, target: str) -> Task:
        """The task as a target sees it while it is being dispatched."""
        return Task(
            task_id=self.task_id,
            platform=platform,
            aigc=aigc,
            backend_id=self.backend_id,
            payload=self.payload,
            state=TaskState.DISPATCHING,
            attempt=self.attempt,
            charged=self.charged,
            target=target,
            workflow_id=self.workflow_id,
        )


@dataclass(frozen=True, slots=True)
class MoveResult:
    """What a write of task state did: ``applied``, and the task's state after it."""

    applied: bool
    state: TaskState | None  # None: the task does not exist (or has expired)
    target: str = ""  # where it ran (set when applied)
    #: its AIGC project and platform (set when a finish applied)
    aigc: str = ""
    platform: str = ""
    #: not applied: a failure reported by an attempt that is no longer the live one
    superseded: bool = False
    #: applied: the remote task of the live attempt, still running on a paid target and
    #: now unwanted (kept in its account's cap as an orphan): cancel it
    orphan: str = ""
    #: applied: a late success, after the task had failed ``UncertainSubmit`` (its client
    #: is sent the success after the failure; see :meth:`TaskStore.release_orphan`)
    late: bool = False
    #: applied or not: the paid target of the unwanted run (orphan) this end of it released;
    #: that run was billed, and this is its one release: the caller charges it
    released: str = ""


@dataclass(frozen=True, slots=True)
class Retried:
    """What :meth:`TaskStore.retry` did: ``applied`` (queued again), the task's state."""

    applied: bool
    state: TaskState | None  # None: no such task
    #: not applied: a paid run's result came after the task ended, kept for delivery
    kept_result: bool = False
    #: not applied: a paid run of it may still be out (its orphan: a remote task id, or
    #: ``create:<createId>`` for a create whose outcome is unknown)
    paid_out: str = ""


@dataclass(frozen=True, slots=True)
class Released:
    """What :meth:`TaskStore.release_orphan` did; true when the orphan left the cap."""

    released: bool
    #: its success won over its task's ``UncertainSubmit`` failure (a late success)
    moved: MoveResult | None = None

    def __bool__(self) -> bool:
        return self.released


@dataclass(frozen=True, slots=True)
class Marked:
    """What :meth:`TaskStore.mark_running` did; true when the task is running."""

    running: bool
    #: the task had moved on: its remote task is an orphan now, to be cancelled
    orphaned: bool = False
    #: the task had failed ``UncertainSubmit`` for want of this reply: its remote task is
    #: an orphan watched until it ends, its success still winning (not cancelled)
    awaited: bool = False

    def __bool__(self) -> bool:
        return self.running


SCRIPTS = (
    "submit",
    "window",
    "claim",
    "begin_create",
    "mark_running",
    "postpone",
    "requeue",
    "retarget",
    "finish",
    "promote",
    "retry",
    "release_orphan",
    "charge",
    "budget",
    "pause_workflow",
    "keyed",
)


@dataclass(frozen=True, slots=True)
class Begun:
    """What :meth:`TaskStore.begin_create` did: ``recorded`` (send the create), else
    ``reached`` says which budget stopped it ("": the task moved on) and ``held`` whether
    that set its project's automatic hold."""

    recorded: bool
    reached: str = ""
    held: bool = False

    def __bool__(self) -> bool:
        return self.recorded


class NotReplicated(RedisError):
    """A write is on the master but fewer replicas than ``AIGCQ_REDIS_MIN_REPLICAS``
    confirmed it in time: a failover now could lose it, so it is not acknowledged."""


class TaskStore:
    def __init__(
        self,
        redis: Redis,
        prefix: str,
        *,
        retention_s: int,
        outbox_retention_s: int,
        free_requeues: int = 1000,
        min_replicas: int = 0,
        wait_timeout_ms: int = 500,
    ):
        self.redis = redis
        self.keys = Keys(prefix)
        self.retention_s = retention_s
        self.outbox_retention_s = outbox_retention_s
        #: how many requeues of one task may give their attempt back (then they charge it)
        self.free_requeues = free_requeues
        #: the paid targets (comma-separated): their unwanted remote tasks become orphans
        self.paid_targets = ""
        #: per paid target, the accounts projects share (:mod:`aigcq.scheduler.shared_keys`)
        self.shared_keys: dict[str, str] = {}
        #: "<half-life s> <default run s>" of the GPU-seconds a run on our GPUs charges
        #: its project and user (``_prelude.lua`` ``gpu_started``; '': none charged)
        self.usage_terms = ""
        self._scripts: dict[str, tuple[AsyncScript, scripts.Script]] = {}
        for name in SCRIPTS:
            script = scripts.load(name)
            self._scripts[name] = (redis.register_script(script.source), script)
        #: the hot-path connection: every per-task command goes through it
        self.mux = RedisMux(redis)
        #: replicas that must have a write before it is acknowledged (0: none, no WAIT)
        self.min_replicas = min_replicas
        self.wait_timeout_ms = wait_timeout_ms
        #: what the queue holds, read (the store's own methods are its moves)
        self.reads = TaskReads(redis, self.keys, self.mux, self._run)

    async def replicated(self) -> bool:
        """Whether ``min_replicas`` replicas have every write made so far on the hot path
        (always, with 0). One WAIT per event-loop turn, shared by its callers."""
        if self.min_replicas <= 0:
            return True
        have = await self.mux.replicas(self.min_replicas, self.wait_timeout_ms)
        return have >= self.min_replicas

    async def _run(self, name: str, /, **args: Any) -> Any:
        """Run our script ``name`` with its declared arguments, by name (the key prefix
        goes first) on the hot-path connection: calls made in the same event-loop turn
        (concurrent submits, callbacks, dispatches) share one write, each script stays
        one atomic step, and calls run in the order made."""
        script, declared = self._scripts[name]
        return await self.mux.script(script, [], declared.argv(self.keys.prefix, args))

    async def aclose(self) -> None:
        await self.mux.aclose()

    # ---- writes ---------------------------------------------------------------------

    async def submit(
        self,
        task_id: str,
        *,
        aigc: str,
        platform: str,
        backend_id: str,
        payload: dict[str, Any],
        deliver: bool = True,
        max_cost: float | None = None,
        ordering: Ordering = AS_SUBMITTED,
        trace: str = "",
    ) -> Submitted:
        """Create a task and queue it; an existing ``task_id`` is returned unchanged.
        ``max_cost``: the most it may cost on a paid platform (None: no limit);
        ``ordering``: when it runs (its user, priority credit, start deadline); ``trace``:
        its trace context (a W3C traceparent, kept as its ``trace`` field; "": none)."""
        now = time.time()
        start_by = ordering.start_by(now)
        expires = start_by is not None and not ordering.keep_waiting
        created, state, owner = await self._run(
            "submit",
            task_id=task_id,
            now=now,
            aigc=aigc,
            platform=platform,
            backend_id=backend_id,
            payload=orjson.dumps(payload),
            workflow_id=workflow_of(payload),
            deliver="1" if deliver else "0",
            max_cost="" if max_cost is None else repr(max_cost),
            order=orjson.dumps([*ordering.fields(now), *(["trace", trace] if trace else [])]),
            expires_at=repr(start_by) if expires else "",
        )
        return Submitted(bool(created), TaskState(text(state)), text(owner))

    async def claim(
        self,
        aigc: str,
        platform: str,
        target: str,
        *,
        cap: int,
        n: int,
        deadline_s: float,
        ids: Sequence[str] | None = None,
        user_limit: int = 0,
    ) -> list[Claimed]:
        """Move up to ``n`` waiting tasks to ``target`` while its in-flight count < ``cap``:
        from the head, or those of ``ids`` still waiting (in that order; with
        ``user_limit`` > 0, passing over those whose end user has that many claimed so)."""
        if n <= 0:
            return []
        rows = await self._run(
            "claim",
            now=time.time(),
            aigc=aigc,
            platform=platform,
            target=target,
            cap=cap,
            n=n,
            deadline_s=deadline_s,
            ids="" if ids is None else orjson.dumps(list(ids)).decode(),
            user_limit=user_limit if ids is not None else 0,
            shared=self.shared_keys.get(target, ""),
        )
        claimed = [
            Claimed(
                text(r[0]),
                int(r[1]),
                orjson.loads(r[2]),
                text(r[3]),
                text(r[4]),
                float(r[5]),
                int(r[6]),
                int(r[7]),
                text(r[8]),
                text(r[9]),
                float(r[10] or 0),
            )
            for r in rows
        ]
        created = (c.created_at for c in claimed)
        metrics.tasks_claimed(aigc, platform, target, created, time.time())
        return claimed

    async def mark_running(
        self,
        task_id: str,
        attempt: int,
        remote_id: str,
        *,
        deadline_s: float,
        kind: str,
        progress: str = "",
        where: tuple[str, str, str] | None = None,
        holder: str = "",
        holder_ttl_s: int = 0,
    ) -> Marked:
        """The target accepted ``attempt`` as ``remote_id`` ('': the create's outcome is
        unknown; the task waits as running for its webhook). ``progress``: the body of a
        ``progress:`` event, published in the same step only when the task's client is
        connected with ``progress=1`` (no round trip, and no message every process decodes
        for nothing). ``where`` (AIGC, platform, paid target): a remote task accepted for
        an attempt that is no longer live becomes an orphan (``orphaned``), inside that
        target's cap until it ends; when its task failed ``UncertainSubmit`` for want of
        this very reply, it is ``awaited`` instead (its success still wins: not cancelled).
        ``holder``: the bridge that acknowledged the task,
        recorded as holding it (:meth:`Keys.bridge_tasks`, :meth:`Keys.bridges_of`, kept
        ``holder_ttl_s``) in the same step, whenever the task is running."""
        now = time.time()
        aigc, platform, target = where or ("", "", "")
        code = await self._run(
            "mark_running",
            task_id=task_id,
            attempt=attempt,
            now=now,
            remote_id=remote_id,
            deadline=now + deadline_s,
            kind=kind,
            callback_ttl=int(deadline_s + self.retention_s),
            progress=progress,
            aigc=aigc,
            platform=platform,
            target=target,
            on_paid=where is not None,
            holder=holder,
            holder_tasks=self.keys.bridge_tasks(holder) if holder else "",
            holder_of=self.keys.bridges_of(task_id) if holder else "",
            holder_ttl=holder_ttl_s,
            late_class=ErrorCode.UNCERTAIN_SUBMIT.value,
            usage_terms=self.usage_terms if where is None else "",
        )
        return Marked(int(code) == 1, int(code) == 2, awaited=int(code) == 3)

    async def retarget(
        self, task_id: str, attempt: int, source: str, target: str, *, cap: int, deadline_s: float
    ) -> int:
        """Move a task claimed for ``source`` (nothing sent yet) to ``target`` in the same
        attempt, while ``target``'s in-flight count < ``cap``: 1 moved, 0 ``target`` is
        full, -1 the task moved on."""
        return int(
            await self._run(
                "retarget",
                task_id=task_id,
                attempt=attempt,
                now=time.time(),
                source=source,
                target=target,
                cap=cap,
                deadline_s=deadline_s,
                shared=self.shared_keys.get(target, ""),
            )
        )

    async def begin_create(
        self, task_id: str, attempt: int, create_id: str, *, deadline_s: float, gate: str = ""
    ) -> Begun:
        """Record that a create for ``attempt`` is about to be sent (a process that
        restarts then knows one may be out), unless a budget ``gate`` names is reached
        (``budget_reached`` in the scripts' prelude; :mod:`aigcq.scheduler.budgets`).
        False (:class:`Begun`): the task moved on or a budget is reached, send nothing."""
        now = time.time()
        code, *rest = await self._run(
            "begin_create",
            task_id=task_id,
            attempt=attempt,
            create_id=create_id,
            now=now,
            deadline=now + deadline_s,
            gate=gate,
        )
        if int(code) >= 0:
            return Begun(recorded=int(code) == 1)
        return Begun(recorded=False, reached=text(rest[0]), held=bool(int(rest[1])))

    async def postpone(self, task_id: str, attempt: int, *, max_delay_s: float) -> float:
        """Ask about the task again later, with back-off; the delay (0: it moved on)."""
        delay = await self._run(
            "postpone", task_id=task_id, attempt=attempt, now=time.time(), max_delay=max_delay_s
        )
        return float(delay)

    # ---- back to waiting: each next claim is a new attempt (its own webhook URL) ----------

    async def requeue_unrun(
        self,
        task_id: str,
        attempt: int,
        reason: str,
        *,
        delay_s: float = 0.0,
        held: bool = False,
    ) -> bool:
        """``attempt``'s target ran nothing (no slot, full, refused, never acknowledged,
        not sent): the task goes back to the head of its queue, or after ``delay_s`` (a
        back-off), and the attempt is given back to its budget (at most ``free_requeues``
        times per task, later ones are charged; ``held``: always, an operator's pause kept
        it from its target). Nothing of the attempt runs anywhere, so no orphan is kept.
        False: ``attempt`` is no longer the live one, or the task is not dispatching or
        running."""
        return await self._requeue(
            Move.REQUEUE_UNRUN,
            task_id,
            attempt,
            reason,
            delay_s=delay_s,
            uncharge=True,
            ended=True,
            free_limit=2**53 if held else None,
        )

    async def requeue_unsent(self, task_id: str, attempt: int, reason: str) -> bool:
        """A task claimed for ``attempt`` and never sent (its process stopped first, or is
        shutting down): back to the head of its queue, the attempt given back as by
        :meth:`requeue_unrun`. Refused while a create may be out for it
        (:meth:`begin_create`) or once it is no longer dispatching."""
        return await self._requeue(
            Move.REQUEUE_UNSENT, task_id, attempt, reason, uncharge=True, unsent_only=True
        )

    async def requeue_for_retry(
        self,
        task_id: str,
        attempt: int,
        reason: str,
        *,
        delay_s: float = 0.0,
        ended: bool = False,
        cost: bytes = b"",
    ) -> bool:
        """``attempt`` failed, timed out, or its target lost it: it stays charged, and the
        task waits for a new attempt at the head of its queue, or after ``delay_s``.
        ``ended``: its remote task is known to be over; otherwise one on a paid target (or
        a create that may be out) is kept in its account's cap as an orphan. ``cost``: what
        the failed run reported it cost (JSON): on a paid target its charge is due in the
        same step (see :meth:`charge`). False: ``attempt`` is no longer the live one, or
        the task is not dispatching or running."""
        return await self._requeue(
            Move.REQUEUE_FOR_RETRY,
            task_id,
            attempt,
            reason,
            delay_s=delay_s,
            ended=ended,
            cost=cost,
        )

    async def requeue_handed_back(
        self, task_id: str, attempt: int, remote_id: str, reason: str
    ) -> bool:
        """A message-dispatcher handed back the task it was running as ``remote_id`` (a
        degrade notice): back to the head of its queue, ``attempt`` charged. Only while the
        task is running as ``remote_id`` in ``attempt``, so one that finished, was retried
        or moved on meanwhile is left as it is."""
        return await self._requeue(
            Move.REQUEUE_HANDED_BACK, task_id, attempt, reason, remote_id=remote_id
        )

    async def _requeue(
        self,
        move: Move,
        task_id: str,
        attempt: int,
        reason: str,
        *,
        delay_s: float = 0.0,
        uncharge: bool = False,
        ended: bool = False,
        remote_id: str = "",
        unsent_only: bool = False,
        free_limit: int | None = None,
        cost: bytes = b"",
    ) -> bool:
        now = time.time()
        result = await self._run(
            "requeue",
            move=move.value,
            task_id=task_id,
            attempt=attempt,
            now=now,
            ready_at=now + delay_s if delay_s > 0 else 0,
            reason=reason,
            remote_id=remote_id,
            unsent_only=unsent_only,
            uncharge=uncharge,
            free_limit=self.free_requeues if free_limit is None else free_limit,
            ended=ended,
            paid_targets=self.paid_targets,
            cost=cost,
        )
        return int(result) == 1

    # ---- the end, and after -----------------------------------------------------------

    async def finish(
        self,
        task_id: str,
        state: TaskState,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        message: dict[str, Any] | None = None,
        note: str = "",
        from_attempt: int | None = None,
        fenced: bool = False,
        ended: bool = False,
        cost: bytes = b"",
    ) -> MoveResult:
        """Move a live task to a terminal ``state`` and queue ``message`` for its client.

        ``from_attempt``: the attempt this end is about (None: none, e.g. a cancel);
        ``fenced``: only while that attempt is the live one (a failure); ``ended``: its
        run is over. Otherwise the live attempt's remote task on a paid target becomes an
        orphan (``MoveResult.orphan``). ``cost``: what the reporting run cost (JSON): the
        charge of a paid run this end bills is due in the same step (see :meth:`charge`)."""
        if state not in TRANSITIONS[Move.FINISH][1]:
            raise ValueError(f"finish does not lead to {state}")
        now = time.time()
        applied, current, *labels = await self._finish_script(
            task_id,
            Move.FINISH,
            state,
            now,
            result_json=orjson.dumps(result),
            error_json=orjson.dumps(error),
            body=orjson.dumps(message or {}),
            info=note,
            from_attempt="" if from_attempt is None else from_attempt,
            fenced=fenced,
            ended=ended,
            late_class=ErrorCode.UNCERTAIN_SUBMIT.value,
            cost=cost,
        )
        code = int(applied)
        if code == 3:  # the success of the run a failure gave up on: it may win
            released = await self.release_orphan(text(labels[0]), result, cost)
            ran_on = text(labels[1]) if released else ""
            return released.moved or MoveResult(False, TaskState(text(current)), released=ran_on)
        if code != 1:
            current_state = TaskState(text(current)) if code >= 0 else None
            ran_on = text(labels[0]) if labels else ""
            return MoveResult(False, current_state, superseded=code == 2, released=ran_on)
        metrics.task_finished(labels[:4], state.value, now)
        aigc, platform, target = (text(v) for v in labels[:3])
        orphan, ran_on = text(labels[4]), text(labels[5])
        return MoveResult(True, state, target, aigc, platform, orphan=orphan, released=ran_on)

    async def _finish_script(
        self,
        task_id: str,
        move: Move,
        to: TaskState,
        now: float,
        *,
        result_json: bytes | str,
        error_json: bytes,
        body: bytes | str,
        info: str,
        quiet: bool = False,
        from_attempt: int | str = "",
        fenced: bool = False,
        ended: bool = False,
        late_class: str = "",
        cost: bytes = b"",
    ) -> list[Any]:
        """One run of ``finish.lua`` as ``move`` (its other arguments are the store's)."""
        reply: list[Any] = await self._run(
            "finish",
            task_id=task_id,
            to=to.value,
            now=now,
            ttl=self.retention_s,
            result_json=result_json,
            error_json=error_json,
            body=body,
            minid=outbox_minid(now, self.outbox_retention_s),
            info=info,
            move=move.value,
            quiet=quiet,
            from_attempt=from_attempt,
            paid_targets=self.paid_targets,
            fenced=fenced,
            ended=ended,
            late_class=late_class,
            cost=cost,
        )
        return reply

    async def keep_by_key(self, queues: Sequence[tuple[str, str]] = ()) -> int:
        """Move ``queues`` (none: every queue Redis names) that an aigcq before issue 37
        wrote as LISTs to the keyed layout (``keyed.lua``); how many it moved."""
        named = orjson.dumps([f"{aigc}:{platform}" for aigc, platform in queues]).decode()
        return int(await self._run("keyed", queues=named))

    async def pause_workflow(self, workflow: str, about: bytes | None) -> bool:
        """Pause ``workflow`` (``about``: the pause's JSON) or resume it (None), and index
        its waiting keys again in the same step (``pause_workflow.lua``): out of the ready
        keys while paused, back when resumed. Whether the pause changed."""
        return bool(await self._run("pause_workflow", workflow=workflow, about=about or b""))

    async def withdraw(self, task_id: str, *, error: dict[str, Any], note: str) -> bool:
        """Cancel a task that is still waiting (never one dispatched or running), with no
        message for its client: its submitter has taken it back. False: not waiting."""
        applied, *_ = await self._finish_script(
            task_id,
            Move.WITHDRAW,
            TaskState.CANCELLED,
            time.time(),
            result_json=orjson.dumps(None),
            error_json=orjson.dumps(error),
            body=orjson.dumps({}),
            info=note,
            quiet=True,
        )
        return int(applied) == 1

    async def expire(
        self, task_id: str, *, error: dict[str, Any], message: dict[str, Any], note: str
    ) -> MoveResult:
        """End a waiting task that never ran (no attempt charged) past its start deadline:
        it fails with ``message`` for its client, nothing was paid. ``applied`` False: it
        is not waiting, or it ran once (then it has no start deadline any more)."""
        now = time.time()
        applied, current, *labels = await self._finish_script(
            task_id,
            Move.EXPIRE,
            TaskState.FAILED,
            now,
            result_json=orjson.dumps(None),
            error_json=orjson.dumps(error),
            body=orjson.dumps(message),
            info=note,
        )
        code = int(applied)
        if code != 1:
            return MoveResult(False, TaskState(text(current)) if code >= 0 else None)
        metrics.task_finished(labels[:4], TaskState.FAILED.value, now)
        aigc, platform = text(labels[0]), text(labels[1])
        return MoveResult(True, TaskState.FAILED, aigc=aigc, platform=platform)

    async def deliver_kept(self, task_id: str, note: str) -> MoveResult:
        """End a failed or cancelled task with the result its paid run brought after it
        ended (kept by the finishing script): its client gets it as any success, nothing
        runs again. ``applied`` False: no such result, or the task is in another state."""
        applied, current, *_ = await self._finish_script(
            task_id,
            Move.REPLAY_RESULT,
            TaskState.SUCCESS,
            time.time(),
            result_json="",  # the script takes the kept one, and makes its message
            error_json=orjson.dumps(None),
            body="",
            info=note,
        )
        code = int(applied)
        return MoveResult(code == 1, TaskState(text(current)) if code >= 0 else None)

    async def retry(self, task_id: str, note: str = "retried") -> Retried:
        """Queue a failed or cancelled task again (an operator's retry): its client gets
        the new attempt's result too. Not one a paid platform may bill twice: one with a
        paid result kept (``kept_result``: :meth:`deliver_kept` it) or a paid run that may
        still be out (``paid_out``) is left as it is. ``applied`` False: not retryable."""
        code, current, *out = await self._run("retry", task_id=task_id, now=time.time(), info=note)
        code = int(code)
        state = TaskState(text(current)) if code >= 0 else None
        return Retried(
            code == 1, state, kept_result=code == 3, paid_out=text(out[0]) if out else ""
        )

    async def promote_delayed(self, limit: int = 500) -> int:
        """Delayed tasks whose back-off is over go to the head of their queue (at most
        ``limit``); how many left the delayed set."""
        return int(await self._run("promote", now=time.time(), limit=limit, only=""))

    async def promote(self, task_id: str) -> bool:
        """``task_id``, if it waits in the delayed set, goes to the head of its queue now,
        due or not (no ``wake`` is published: the caller dispatches it)."""
        return int(await self._run("promote", now=time.time(), limit=1, only=task_id)) == 1

    async def release_orphan(
        self, remote_id: str, result: Any = None, cost: bytes = b""
    ) -> Released:
        """The platform says this unwanted remote task ended: it leaves the cap. ``result``:
        the success it reported. It wins when its task failed ``UncertainSubmit`` and this
        orphan is the paid run of the attempt that failed (``Released.moved``): the task
        ends a success, and its client is sent it, marked ``late``, after the failure.
        Otherwise it is kept on its task if that ended failed or cancelled. ``cost``: what
        the platform says the run cost (JSON): its charge is due in the same step."""
        now = time.time()
        code, *labels = await self._run(
            "release_orphan",
            remote_id=remote_id,
            result_json="" if result is None else orjson.dumps(result).decode(),
            now=now,
            late_class=ErrorCode.UNCERTAIN_SUBMIT.value,
            minid=outbox_minid(now, self.outbox_retention_s),
            cost=cost,
        )
        if int(code) != 2:
            return Released(int(code) == 1)
        aigc, platform, target = (text(v) for v in labels)
        metrics.late_success(aigc, platform, target)
        moved = MoveResult(True, TaskState.SUCCESS, target, aigc, platform, late=True)
        return Released(True, moved)

    async def release_create(self, create_id: str) -> bool:
        """The platform answered the create ``create_id`` with a definite "not created":
        the slot its task's moving on left it as (``create:<createId>``) is free."""
        return bool(await self.release_orphan(f"create:{create_id}"))

    async def check_orphan_later(self, o: Orphan, delay_s: float) -> None:
        key = self.keys.orphans(o.aigc, o.target)
        await self.redis.zadd(key, {o.remote_id: time.time() + delay_s}, xx=True)

    async def charge(
        self,
        task_id: str,
        due: str,
        *,
        target: str,
        account: str,
        default_workflow: str,
        periods: Mapping[str, tuple[str, int]],
        record: dict[str, Any],
        figures: Mapping[str, float],
    ) -> bool:
        """Charge the billed run whose charge is ``due`` on the task (a field the end that
        billed it wrote: ``due.<attempt>.<target>`` = "<ended at> <1: on the task, 0: a
        run it no longer wanted> <cost JSON>") what it cost (``figures``: amount, estimated,
        coins, seconds) in the spend hashes of ``periods`` (``day`` / ``month`` -> its name
        and how long its hash is kept), keeping ``record`` on the task if the due says so,
        and the due goes, in one step (``charge.lua``, laid out for
        :mod:`aigcq.scheduler.spend`). False: not due (charged already, or no such task)."""
        done = await self._run(
            "charge",
            task_id=task_id,
            due=due,
            target=target,
            account=account,
            default_workflow=default_workflow,
            day=periods["day"][0],
            month=periods["month"][0],
            day_keep=periods["day"][1],
            month_keep=periods["month"][1],
            record=orjson.dumps(record),
            amount=_decimal(figures["amount"]),
            estimated=_decimal(figures["estimated"]),
            coins=_decimal(figures["coins"]),
            seconds=_decimal(figures["seconds"]),
        )
        return bool(done)

    # ---- reads ----------------------------------------------------------------------


def _decimal(value: float) -> str:
    """A figure as ``HINCRBYFLOAT`` reads it (shortest exact decimal)."""
    return repr(float(value))


def workflow_of(payload: dict[str, Any]) -> str:
    """The workflow or model a payload names; kept in the task (and in its orphans), as a
    platform's status query may need it (its spec's ``workflow_field``)."""
    return next((str(payload[f]) for f in workflow_fields() if payload.get(f)), "")
