"""``asynch_task`` and ``asynch_model_stat``: insert, claim, finish, read, batch claim 2 → 4."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from aigcq.asynch.db import Pool, Row
from aigcq.asynch.states import State

PUBLIC_COLUMNS = (
    "task_id, model_name, biz_name, state, retry_count, oss_file, file_type, text, error,"
    " enqueue_at, started_at, finished_at, expire_at, created_at"
)
_CLAIM_COLUMNS = (
    "task_id, model_name, tenant_id, creator, biz_name, callback_url, model_key,"
    " request_payload, auth_header, user_info, attempt"
)
_CANDIDATES = """
SELECT t.task_id, t.model_name, t.tenant_id, t.attempt, m.max_concurrency
FROM asynch_task t JOIN asynch_models m ON m.model_name = t.model_name
WHERE t.state = 0 AND (%(task_id)s::text IS NULL OR t.task_id = %(task_id)s::text)
ORDER BY t.priority DESC, t.enqueue_at, t.id
LIMIT %(limit)s FOR UPDATE OF t SKIP LOCKED
"""
_START = f"""
UPDATE asynch_task SET state = 1, started_at = now(), attempt = attempt + 1, updated_at = now()
WHERE task_id = ANY(%s) RETURNING {_CLAIM_COLUMNS}
"""
_FINISH = """
WITH stat AS (
    INSERT INTO asynch_model_stat (day, tenant_id, creator, model_name, request_count)
    SELECT current_date, %(tenant_id)s, %(creator)s, %(model_name)s, 1 WHERE %(called)s
    ON CONFLICT (day, tenant_id, creator, model_name) DO UPDATE
    SET request_count = asynch_model_stat.request_count + 1, updated_at = now()
)
UPDATE asynch_task
SET state = %(state)s, oss_file = %(oss_file)s, file_type = %(file_type)s, text = %(text)s,
    error = %(error)s, finished_at = now(), updated_at = now()
WHERE task_id = %(task_id)s AND state = 1 AND attempt = %(attempt)s
RETURNING task_id
"""
_BATCH = f"""
WITH claimed AS (
    UPDATE asynch_task t SET state = 4, updated_at = now(),
        expire_at = now() + make_interval(secs => COALESCE(
            (SELECT m.auto_clean_seconds FROM asynch_models m WHERE m.model_name = t.model_name),
            3600))
    WHERE t.task_id = ANY(%(ids)s) AND t.state = 2
    RETURNING {PUBLIC_COLUMNS}
)
SELECT {PUBLIC_COLUMNS} FROM claimed
UNION ALL
SELECT {PUBLIC_COLUMNS} FROM asynch_task
WHERE task_id = ANY(%(ids)s) AND task_id NOT IN (SELECT task_id FROM claimed)
"""


@dataclass(frozen=True)
class ClaimedTask:
    """A task in state 1 as the worker runs it; ``attempt`` fences stale finishes."""

    task_id: str
    model_name: str
    tenant_id: str
    creator: str
    biz_name: str
    callback_url: str
    model_key: str
    request_payload: Any
    auth_header: str
    user_info: str
    attempt: int

    @classmethod
    def from_row(cls, row: Row) -> ClaimedTask:
        return cls(**{f.name: row[f.name] for f in fields(cls)})

    @property
    def lease_id(self) -> str:
        """The semaphore member of this attempt."""
        return lease_id(self.task_id, self.attempt)


def lease_id(task_id: str, attempt: int) -> str:
    return f"{task_id}:{attempt}"


@dataclass(frozen=True)
class Outcome:
    state: State
    called: bool
    oss_file: str | None = None
    file_type: str | None = None
    text: str | None = None
    error: str | None = None


class Claim(NamedTuple):
    rows: list[Row]  # the tasks now in state 1
    candidates: int  # queued tasks looked at (0: the queue was empty)


# Decides, per candidate (task_id, model_name, tenant_id, next attempt, max_concurrency),
# whether it may start now (it takes a semaphore lease when it says yes).
Admit = Callable[[str, str, str, int, int], Awaitable[bool]]


class TaskRepo:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def insert(self, task: ClaimedTask, *, running: bool) -> None:
        """Insert a new task, queued (state 0) or already started (state 1, attempt 1)."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO asynch_task (task_id, model_name, tenant_id, creator, biz_name,"
                " callback_url, model_key, request_payload, auth_header, user_info,"
                " state, started_at, attempt)"
                " VALUES (%(task_id)s, %(model_name)s, %(tenant_id)s, %(creator)s, %(biz_name)s,"
                " %(callback_url)s, %(model_key)s, %(payload)s, %(auth_header)s, %(user_info)s,"
                " %(state)s, CASE WHEN %(running)s THEN now() END, %(attempt)s)",
                {
                    **asdict(task),
                    "payload": Jsonb(task.request_payload),
                    "running": running,
                    "state": State.RUNNING if running else State.QUEUED,
                },
            )

    async def claim(self, admit: Admit, limit: int, task_id: str | None = None) -> Claim:
        """Claim up to ``limit`` queued tasks (or just ``task_id``) that ``admit`` lets start.

        Candidates are locked with ``FOR UPDATE SKIP LOCKED``, so concurrent claimers never
        get the same task; up to four times ``limit`` are looked at, so a model at its
        concurrency limit does not block the others behind it.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_CANDIDATES, {"task_id": task_id, "limit": limit * 4})
            candidates = await cur.fetchall()
            chosen: list[str] = []
            for c in candidates:
                if len(chosen) < limit and await admit(
                    c["task_id"], c["model_name"], c["tenant_id"], c["attempt"] + 1,
                    c["max_concurrency"],
                ):  # fmt: skip
                    chosen.append(c["task_id"])
            if not chosen:
                return Claim([], len(candidates))
            cur = await conn.execute(_START, (chosen,))
            return Claim(await cur.fetchall(), len(candidates))

    async def finish(self, task: ClaimedTask, outcome: Outcome) -> bool:
        """Record the attempt's outcome (and one model call when ``outcome.called``).

        False when the attempt is stale: the cleaner timed it out meanwhile.
        """
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _FINISH,
                {
                    "task_id": task.task_id,
                    "attempt": task.attempt,
                    "tenant_id": task.tenant_id,
                    "creator": task.creator,
                    "model_name": task.model_name,
                    "called": outcome.called,
                    "state": outcome.state,
                    "oss_file": outcome.oss_file,
                    "file_type": outcome.file_type,
                    "text": outcome.text,
                    "error": outcome.error,
                },
            )
            return await cur.fetchone() is not None

    async def state_of(self, task_id: str) -> int | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT state FROM asynch_task WHERE task_id = %s", (task_id,))
            row = await cur.fetchone()
            return None if row is None else int(row["state"])

    async def get(self, task_id: str) -> Row | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {PUBLIC_COLUMNS} FROM asynch_task WHERE task_id = %s", (task_id,)
            )
            return await cur.fetchone()

    async def batch(self, task_ids: Sequence[str]) -> list[Row]:
        """The rows of ``task_ids`` (missing ones are left out); state 2 becomes 4 with
        ``expire_at = now + auto_clean_seconds``."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_BATCH, {"ids": list(dict.fromkeys(task_ids))})
            return await cur.fetchall()
