"""TaskStore: the only code that writes task state. Each method is one atomic Lua call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from aigcq.domain import Move, Task, TaskState, allowed_from
from aigcq.observability import metrics
from aigcq.plumbing.redis_mux import RedisMux
from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys


def _load(name: str) -> str:
    lua = resources.files("aigcq.queue") / "lua"
    return (lua / "_prelude.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


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
            target=target,
            workflow_id=self.workflow_id,
        )


@dataclass(frozen=True, slots=True)
class MoveResult:
    """What a write of task state did: ``applied``, and the task's state after it."""

    applied: bool
    state: TaskState | None  # None: the task does not exist (or has expired)
    target: str = ""  # where it ran (set when applied)


class TaskStore:
    def __init__(self, redis: Redis, prefix: str, *, retention_s: int, outbox_retention_s: int):
        self.redis = redis
        self.keys = Keys(prefix)
        self.retention_s = retention_s
        self.outbox_retention_s = outbox_retention_s
        self._scripts: dict[str, AsyncScript] = {
            name: redis.register_script(_load(name))
            for name in ("submit", "claim", "mark_running", "requeue", "finish", "promote", "retry")
        }
        #: the hot-path connection: every per-task command goes through it
        self.mux = RedisMux(redis)

    async def _run(self, name: str, *args: Any) -> Any:
        """Run our script ``name`` (its first argument is always the key prefix) on the
        hot-path connection: calls made in the same event-loop turn (concurrent submits,
        callbacks, dispatches) share one write, each script stays one atomic step, and
        calls run in the order made."""
        return await self.mux.script(self._scripts[name], [], [self.keys.prefix, *args])

    def _outbox_minid(self, now: float) -> int:
        """Outbox entries older than the retention go (``XADD MINID``, milliseconds)."""
        return int((now - self.outbox_retention_s) * 1000)

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
    ) -> Submitted:
        """Create a task and queue it; an existing ``task_id`` is returned unchanged."""
        workflow_id = str(payload.get("workflowId") or payload.get("workflow_id") or "")
        created, state, owner = await self._run(
            "submit",
            task_id,
            time.time(),
            aigc,
            platform,
            backend_id,
            orjson.dumps(payload),
            workflow_id,
            "1" if deliver else "0",
        )
        return Submitted(bool(created), TaskState(text(state)), text(owner))

    async def claim(
        self, aigc: str, platform: str, target: str, *, cap: int, n: int, deadline_s: float
    ) -> list[Claimed]:
        """Move up to ``n`` waiting tasks to ``target`` while its in-flight count < ``cap``."""
        if n <= 0:
            return []
        rows = await self._run(
            "claim",
            time.time(),
            aigc,
            platform,
            target,
            cap,
            n,
            deadline_s,
            allowed_from(Move.CLAIM, TaskState.DISPATCHING),
        )
        claimed = [
            Claimed(text(r[0]), int(r[1]), orjson.loads(r[2]), text(r[3]), text(r[4]), float(r[5]))
            for r in rows
        ]
        metrics.tasks_claimed(platform, target, (c.created_at for c in claimed), time.time())
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
    ) -> bool:
        """``progress``: the body of a ``progress:`` event, published in the same step
        only when the task's client is connected with ``progress=1`` (no round trip, and
        no message every process decodes for nothing)."""
        now = time.time()
        return bool(
            await self._run(
                "mark_running",
                task_id,
                attempt,
                now,
                remote_id,
                now + deadline_s,
                kind,
                int(deadline_s + self.retention_s),
                allowed_from(Move.MARK_RUNNING, TaskState.RUNNING),
                progress,
            )
        )

    async def requeue(
        self,
        task_id: str,
        *,
        attempt: int | None = None,
        delay_s: float = 0.0,
        front: bool = True,
        refund: bool = False,
        reason: str = "",
        remote_id: str = "",
    ) -> bool:
        """Back to waiting. ``refund`` undoes the attempt count (the target never ran it);
        ``remote_id``: only while the task still carries this remote task id."""
        now = time.time()
        result = await self._run(
            "requeue",
            task_id,
            "" if attempt is None else attempt,
            now,
            now + delay_s if delay_s > 0 else 0,
            int(front),
            int(refund),
            reason,
            allowed_from(Move.REQUEUE, TaskState.PENDING),
            remote_id,
        )
        return int(result) == 1

    async def finish(
        self,
        task_id: str,
        state: TaskState,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        message: dict[str, Any] | None = None,
        note: str = "",
    ) -> MoveResult:
        """Move a live task to a terminal ``state`` and queue ``message`` for its client."""
        assert state.terminal
        now = time.time()
        minid = self._outbox_minid(now)
        applied, current, *labels = await self._run(
            "finish",
            task_id,
            state.value,
            now,
            self.retention_s,
            orjson.dumps(result),
            orjson.dumps(error),
            orjson.dumps(message or {}),
            minid,
            note,
            allowed_from(Move.FINISH, state),
        )
        code = int(applied)
        if code != 1:
            return MoveResult(False, TaskState(text(current)) if code >= 0 else None)
        metrics.task_finished(labels, state.value, now)
        return MoveResult(True, state, text(labels[2]))

    async def withdraw(self, task_id: str, *, error: dict[str, Any], note: str) -> bool:
        """Cancel a task that is still waiting (never one dispatched or running), with no
        message for its client: its submitter has taken it back. False: not waiting."""
        now = time.time()
        minid = self._outbox_minid(now)
        applied, *_ = await self._run(
            "finish",
            task_id,
            TaskState.CANCELLED.value,
            now,
            self.retention_s,
            orjson.dumps(None),
            orjson.dumps(error),
            orjson.dumps({}),
            minid,
            note,
            allowed_from(Move.WITHDRAW, TaskState.CANCELLED),
            "1",
        )
        return int(applied) == 1

    async def retry(self, task_id: str, note: str = "retried") -> MoveResult:
        """Queue a failed or cancelled task again (an operator's retry). Its client gets
        the new attempt's result too. ``applied`` False: not retryable in ``state``."""
        allowed = allowed_from(Move.RETRY, TaskState.PENDING)
        applied, current = await self._run("retry", task_id, time.time(), allowed, note)
        code = int(applied)
        return MoveResult(code == 1, TaskState(text(current)) if code >= 0 else None)

    async def promote_delayed(self, limit: int = 500) -> int:
        return int(await self._run("promote", time.time(), limit))

    # ---- reads ----------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        raw = await self.redis.hgetall(self.keys.task(task_id))
        return task_from_hash(raw) if raw else None

    async def head(self, task_id: str) -> Task | None:
        """The task without its payload, result and error (left empty): one HMGET of the
        small fields, for hot paths that only route on state and target."""
        values = await self.mux.command("HMGET", self.keys.task(task_id), *_HEAD)
        if values[0] is None:
            return None
        return task_from_hash({k: v for k, v in zip(_HEAD, values, strict=True) if v is not None})

    async def timeline(self, task_id: str) -> list[dict[str, Any]]:
        rows = await self.redis.lrange(self.keys.timeline(task_id), 0, -1)
        return [orjson.loads(r) for r in rows]

    async def recent(self, limit: int) -> list[Task]:
        """The most recently finished tasks that are still retained, newest first."""
        ids = await self.redis.lrange(self.keys.recent, 0, max(limit, 1) - 1)
        pipe = self.redis.pipeline(transaction=False)
        for task_id in ids:
            pipe.hgetall(self.keys.task(text(task_id)))
        return [task_from_hash(raw) for raw in await pipe.execute() if raw]

    async def task_for_remote(self, remote_id: str) -> str | None:
        value = await self.redis.get(self.keys.callback(remote_id))
        return text(value) if value else None

    async def expired(self, limit: int = 200) -> list[str]:
        ids = await self.redis.zrangebyscore(self.keys.inflight, "-inf", time.time(), 0, limit)
        return [text(i) for i in ids]


_HEAD = [
    "taskId",
    "platform",
    "AIGC",
    "backendId",
    "status",
    "attempt",
    "target",
    "remoteTaskId",
    "workflowId",
    "created",
    "updated",
    "deadline",
]


def task_from_hash(raw: dict[Any, Any]) -> Task:
    h = {text(k): text(v) for k, v in raw.items()}
    return Task(
        task_id=h["taskId"],
        platform=h.get("platform", ""),
        aigc=h.get("AIGC", ""),
        backend_id=h.get("backendId", ""),
        payload=orjson.loads(h.get("payload") or "{}"),
        state=TaskState(h.get("status", "pending")),
        attempt=int(h.get("attempt") or 0),
        target=h.get("target", ""),
        remote_id=h.get("remoteTaskId", ""),
        workflow_id=h.get("workflowId", ""),
        created_at=float(h.get("created") or 0),
        updated_at=float(h.get("updated") or 0),
        deadline=float(h.get("deadline") or 0),
        result=orjson.loads(h["resultData"]) if h.get("resultData") else None,
        error=orjson.loads(h["error"]) if h.get("error") else None,
    )
