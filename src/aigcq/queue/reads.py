"""What the queue holds, read: a task (whole, or its head for the hot paths), its
timeline, the recently finished, the waiting window a dispatch round plans from
(``window.lua``), what is in flight and past its deadline, the start deadlines passed,
unwanted remote tasks (orphans) and the charges left due. Nothing here changes a task:
the moves are :class:`aigcq.queue.store.TaskStore`'s.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis

from aigcq.domain import Task, TaskState
from aigcq.plumbing.redis_mux import RedisMux
from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys


@dataclass(frozen=True, slots=True)
class Orphan:
    """A remote task we no longer want that may still run (and count against the cap)."""

    remote_id: str
    task_id: str
    attempt: int
    aigc: str
    platform: str
    target: str
    workflow_id: str
    #: when the create of a run with no remote id yet was recorded (0: the id is known)
    create_at: float = 0.0
    #: the run of the attempt its task failed ``UncertainSubmit`` for want of its reply:
    #: watched, never cancelled (its success still wins)
    awaited: bool = False

    @property
    def awaiting_create(self) -> bool:
        """A create whose outcome is unknown: nothing to ask or cancel until its remote
        id, its webhook or its deadline resolves it."""
        return self.create_at > 0


@dataclass(frozen=True, slots=True)
class Windowed:
    """A waiting task a round reads (``window.lua``), with what the scheduler weighs."""

    aigc: str
    platform: str
    task_id: str
    created: float
    workflow_id: str
    user: str
    credit_s: float
    start_by: float | None
    keep_waiting: bool


@dataclass(frozen=True, slots=True)
class Window:
    """What one round of the scheduler weighs (:meth:`TaskReads.window`)."""

    tasks: list[Windowed]
    #: the internal target's tasks in flight: (workflowId, started; None: not yet running)
    busy: list[tuple[str, float | None]]
    #: workflowId -> its recent mean run time (s)
    runs: dict[str, float]
    #: usage key -> (GPU-seconds, when recorded)
    usage: dict[str, tuple[float, float]]
    #: (project, userId) -> its tasks claimed for our GPUs (read with a user limit)
    users: dict[tuple[str, str], int]
    #: project -> its tasks in flight on the internal target
    running: dict[str, int] = field(default_factory=dict)
    #: ``users_max`` left users (or keys) with ready work unread
    truncated: bool = False


class TaskReads:
    """Reads of the queue's Redis (see the module); the store's :attr:`TaskStore.reads`."""

    def __init__(
        self, redis: Redis, keys: Keys, mux: RedisMux, run: Callable[..., Awaitable[Any]]
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.mux = mux
        self._run = run

    async def budget_reached(self, gate: str) -> str:
        """What of ``gate``'s budgets is reached now ("": none), as :meth:`begin_create`
        checks it."""
        return text(await self._run("budget", gate=gate))

    async def past_start_by(self, limit: int = 500) -> list[str]:
        """Waiting tasks past their start deadline (those that expire), oldest first."""
        ids = await self.redis.zrangebyscore(self.keys.startby, "-inf", time.time(), 0, limit)
        return [text(i) for i in ids]

    async def orphans_due(self, aigc: str, target: str, limit: int = 100) -> list[Orphan]:
        """Orphans of one account whose next check is due."""
        key = self.keys.orphans(aigc, target)
        ids = await self.redis.zrangebyscore(key, "-inf", time.time(), 0, limit)
        pipe = self.redis.pipeline(transaction=False)
        for remote in ids:
            pipe.hgetall(self.keys.orphan(text(remote)))
        found = []
        for remote, raw in zip(ids, await pipe.execute(), strict=True):
            if not raw:  # released meanwhile, or its record lost: nothing left to watch
                await self.redis.zrem(key, text(remote))
                continue
            found.append(_orphan(text(remote), raw))
        return found

    async def orphans_of(self, remote_id: str) -> Orphan | None:
        """The orphan record of a remote task (None: not an orphan, or released)."""
        raw = await self.redis.hgetall(self.keys.orphan(remote_id))
        return _orphan(remote_id, raw) if raw else None

    async def dues(self, task_id: str) -> tuple[tuple[str, str], dict[str, str]]:
        """A task's queue (AIGC, platform) and the charges due on it (field -> value, see
        :meth:`charge`)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.task(task_id), "AIGC", "platform")
        pipe.hscan(self.keys.task(task_id), 0, match="due.*", count=1000)
        (aigc, platform), (_, found) = await pipe.execute()
        due = {text(k): text(v) for k, v in found.items()}
        return (text(aigc or ""), text(platform or "")), due

    async def overdue(self, before: float, limit: int = 100) -> list[str]:
        """Tasks with a charge due since before ``before`` (its process died before it
        charged, or Redis failed it then); an id whose task is gone leaves the index."""
        ids = [
            text(i)
            for i in await self.redis.zrangebyscore(self.keys.dues, "-inf", before, 0, limit)
        ]
        if ids:
            pipe = self.redis.pipeline(transaction=False)
            for task_id in ids:
                pipe.exists(self.keys.task(task_id))
            gone = [i for i, there in zip(ids, await pipe.execute(), strict=True) if not there]
            if gone:
                await self.redis.zrem(self.keys.dues, *gone)
            ids = [i for i in ids if i not in gone]
        return ids

    async def window(
        self,
        queues: Sequence[tuple[str, str]],
        n: int,
        target: str,
        *,
        dated: int = 0,
        busy_max: int = 4096,
        user_limit: int = 0,
        users_max: int = 0,
        by_rank: bool = False,
    ) -> Window:
        """The first ``n`` waiting tasks of every ready key of ``queues``, the ``dated``
        ones with the earliest start deadlines wherever they wait, and what the policy
        weighs with them (``window.lua``), in one step. ``busy_max``: the tasks in flight
        read per project (0: only when a task read has a start deadline; < 0: none).
        ``users_max`` > 0: of each queue only the ready keys of the ``users_max`` users
        fair shares put first (``by_rank``: the ``users_max`` ready keys of lowest rank),
        what a round that fills that many places needs, however many users wait."""
        raw = orjson.loads(
            await self._run(
                "window",
                queues=orjson.dumps([list(q) for q in queues]),
                n=n,
                dated=dated,
                target=target,
                busy_max=busy_max,
                user_limit=user_limit,
                users_max=users_max,
                by_rank=int(by_rank),
            )
        )
        return Window(
            tasks=[_windowed(row) for row in raw.get("tasks") or []],
            busy=[(w, float(s) if s else None) for w, s in raw.get("busy") or []],
            runs=run_means(raw.get("runs") or []),
            usage={k: _pair(v) for k, v in (raw.get("usage") or {}).items()},
            users={_who(k): int(v) for k, v in (raw.get("users") or {}).items()},
            running={k: int(v) for k, v in (raw.get("running") or {}).items()},
            truncated=bool(raw.get("truncated")),
        )

    async def max_cost(self, task_id: str) -> float | None:
        """The most the task may cost on a paid platform (its client's ``maxCost``)."""
        [raw] = await self.mux.commands(["HGET", self.keys.task(task_id), "maxCost"])
        return None if raw is None else float(text(raw))

    async def get(self, task_id: str) -> Task | None:
        raw = await self.redis.hgetall(self.keys.task(task_id))
        return task_from_hash(raw) if raw else None

    async def head(self, task_id: str) -> Task | None:
        """The task without its payload and result (left empty): one HMGET of the small
        fields (the error's too), for hot paths that only route on state and target."""
        values = await self.mux.command("HMGET", self.keys.task(task_id), *_HEAD)
        return _from_head(values)

    async def heads(self, task_ids: Sequence[str]) -> list[Task]:
        """:meth:`head` of each of ``task_ids`` (those that exist, in order), in one round
        trip."""
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self.keys.task(task_id), _HEAD)
        found = [_from_head(values) for values in await pipe.execute()]
        return [t for t in found if t is not None]

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

    async def expired(self, page: int = 1000) -> list[str]:
        """Every task in flight past its deadline, read a page at a time."""
        return await self.in_flight(time.time(), page)

    async def in_flight(self, until: float | str = "+inf", page: int = 1000) -> list[str]:
        """Every task in flight with a deadline up to ``until``, read a page at a time."""
        found = list[str]()
        while True:
            ids = await self.redis.zrangebyscore(
                self.keys.inflight, "-inf", until, len(found), page
            )
            found += [text(i) for i in ids]
            if len(ids) < page:
                return found


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
    "error",  # small: a failure's class, code and message
]


def run_means(raw: Mapping[Any, Any] | Sequence[Any]) -> dict[str, float]:
    """workflowId -> recent mean run time (s) of an HGETALL of ``{P}:runs`` (a dict, or
    a flat list of field, value; each value "<mean s> <count>")."""
    pairs = raw.items() if isinstance(raw, Mapping) else zip(raw[::2], raw[1::2], strict=True)
    return {text(w): float(text(v).split()[0]) for w, v in pairs}


def _windowed(row: list[str]) -> Windowed:
    aigc, platform, task_id, created, workflow, user, credit, start_by, keep = row
    return Windowed(
        aigc,
        platform,
        task_id,
        float(created),
        workflow,
        user,
        float(credit or 0),
        float(start_by) if start_by else None,
        keep == "1",
    )


def _who(key: str) -> tuple[str, str]:
    """(project, userId) of a window's ``"<aigc>\n<userId>"``."""
    aigc, _, user = key.partition("\n")
    return aigc, user


def _pair(value: str) -> tuple[float, float]:
    """A usage record, "<value> <at> <half-life>" (an older aigcq's: "<value> <at>"): its
    value and when."""
    first, second, *_ = [*value.split(), "0"]
    return float(first), float(second)


def _from_head(values: list[Any]) -> Task | None:
    """The task of an HMGET of ``_HEAD`` (None: there is no such task)."""
    if values[0] is None:
        return None
    return task_from_hash({k: v for k, v in zip(_HEAD, values, strict=True) if v is not None})


def _orphan(remote_id: str, raw: dict[Any, Any]) -> Orphan:
    h = {text(k): text(v) for k, v in raw.items()}
    return Orphan(
        remote_id,
        h.get("taskId", ""),
        int(h.get("attempt") or 0),
        h.get("AIGC", ""),
        h.get("platform", ""),
        h.get("target", ""),
        h.get("workflowId", ""),
        float(h.get("createAt") or 0),
        h.get("awaited") == "1",
    )


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
        charged=int(h.get("charged") or h.get("attempt") or 0),
        create_id=h.get("createId", ""),
        create_at=float(h.get("createAt") or 0),
        target=h.get("target", ""),
        remote_id=h.get("remoteTaskId", ""),
        workflow_id=h.get("workflowId", ""),
        created_at=float(h.get("created") or 0),
        updated_at=float(h.get("updated") or 0),
        deadline=float(h.get("deadline") or 0),
        result=orjson.loads(h["resultData"]) if h.get("resultData") else None,
        error=orjson.loads(h["error"]) if h.get("error") else None,
        trace=h.get("trace", ""),
    )
