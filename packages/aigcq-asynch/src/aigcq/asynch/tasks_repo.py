"""``asynch_task`` and ``asynch_model_stat``: insert, claim, finish, read, batch claim 2 → 4."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import orjson
import psycopg

from aigcq.asynch.callback import callback_request
from aigcq.asynch.coalesce import Coalescer
from aigcq.asynch.db import Pool, Row
from aigcq.asynch.states import State
from aigcq.observability.jsonlog import ctx

log = logging.getLogger(__name__)

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
# Finishes a batch of attempts: one row per attempt (fenced by state 1 and its attempt
# number) and one model call counted per attempt that reached the model service.
# The batch goes as one JSON document: psycopg dumps one text parameter far cheaper than a
# dozen arrays, and PostgreSQL unpacks it in C.
_FINISH = """
WITH i AS (
    SELECT * FROM json_to_recordset(%s::json) AS i(task_id text, attempt int, state smallint,
        oss_file text, file_type text, text text, error text, called bool, tenant_id text,
        creator text, model_name text, cb_url text, cb_params json)
), stat AS (
    INSERT INTO asynch_model_stat AS s (day, tenant_id, creator, model_name, request_count)
    SELECT current_date, i.tenant_id, i.creator, i.model_name, count(*)
    FROM i WHERE i.called
    GROUP BY i.tenant_id, i.creator, i.model_name
    ORDER BY i.tenant_id, i.creator, i.model_name
    ON CONFLICT (day, tenant_id, creator, model_name) DO UPDATE
    SET request_count = s.request_count + EXCLUDED.request_count, updated_at = now()
), done AS (
    UPDATE asynch_task t
    SET state = i.state, oss_file = i.oss_file, file_type = i.file_type, text = i.text,
        error = i.error, finished_at = now(), updated_at = now()
    FROM i
    WHERE t.task_id = i.task_id AND t.state = 1 AND t.attempt = i.attempt
    RETURNING t.task_id, t.attempt
), owed AS (
    INSERT INTO asynch_callback (task_id, url, params)
    SELECT i.task_id, i.cb_url, i.cb_params
    FROM i JOIN done ON done.task_id = i.task_id AND done.attempt = i.attempt
    WHERE i.cb_url IS NOT NULL
)
SELECT task_id, attempt FROM done
"""
# Whether an attempt's outcome is recorded (a finishing write whose reply was lost).
_RECORDED = """
SELECT 1 FROM asynch_task WHERE task_id = %(task_id)s AND attempt = %(attempt)s
    AND finished_at IS NOT NULL AND (state = %(state)s OR (%(state)s = 2 AND state = 4))
    AND oss_file IS NOT DISTINCT FROM %(oss_file)s AND error IS NOT DISTINCT FROM %(error)s
"""
#: PostgreSQL unreachable (restarting, failing over, pool exhausted): retry the write.
PG_OUTAGE = (psycopg.OperationalError, psycopg.InterfaceError)
# Only for a model that exists and is enabled now (a process's cached config may be older
# than another's deleteModel): its row is share-locked, so a concurrent delete (which locks
# it FOR UPDATE, then counts live tasks) either sees the new row or is seen to have won.
_INSERT = """
INSERT INTO asynch_task (task_id, model_name, tenant_id, creator, biz_name, callback_url,
    model_key, request_payload, auth_header, user_info, state, started_at, attempt)
SELECT i.task_id, i.model_name, i.tenant_id, i.creator, i.biz_name, i.callback_url,
    i.model_key, i.request_payload, i.auth_header, i.user_info, i.state,
    CASE WHEN i.state = 1 THEN now() END, i.attempt
FROM json_to_recordset(%s::json) AS i(task_id text, model_name text, tenant_id text,
    creator text, biz_name text, callback_url text, model_key text, request_payload jsonb,
    auth_header text, user_info text, state smallint, attempt int)
JOIN asynch_models m ON m.model_name = i.model_name AND m.enabled = 1
FOR KEY SHARE OF m
RETURNING task_id
"""
_DEADLOCK_RETRIES = 3
FINISH_RETRY_MAX_PAUSE = 2.0
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


def _json(value: Any) -> str:
    """orjson, or the standard library for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


def _storable(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL: a model reply's text or error keeps U+FFFD instead
    (the stored file keeps every byte)."""
    return text.replace("\x00", "\ufffd") if text and "\x00" in text else text


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


def _owed_callback(task: ClaimedTask, outcome: Outcome) -> dict[str, Any]:
    """The callback a success owes (seed: GET on success, with ``callbackUrl`` and
    ``bizName``), as the finishing statement's ``cb_url`` / ``cb_params``."""
    if outcome.state is not State.SUCCEEDED or not task.callback_url or not task.biz_name:
        return {"cb_url": None, "cb_params": None}
    url, params = callback_request(
        task.callback_url,
        task.biz_name,
        task_id=task.task_id,
        state=int(outcome.state),
        oss_file=outcome.oss_file or "",
        file_type=outcome.file_type or "",
        text=outcome.text,
    )
    return {"cb_url": url, "cb_params": params}


class Claim(NamedTuple):
    rows: list[Row]  # the tasks now in state 1
    candidates: int  # queued tasks looked at (0: the queue was empty)


# Decides, per candidate (task_id, model_name, tenant_id, next attempt, max_concurrency),
# whether it may start now (it takes a semaphore lease when it says yes).
Admit = Callable[[str, str, str, int, int], Awaitable[bool]]


class TaskRepo:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._inserts: Coalescer[tuple[ClaimedTask, bool], bool] = Coalescer(self._insert_batch)
        self._finishes: Coalescer[tuple[ClaimedTask, Outcome], bool] = Coalescer(self._finish_rows)

    async def insert(self, task: ClaimedTask, *, running: bool) -> bool:
        """Insert a new task, queued (state 0) or already started (state 1, attempt 1);
        False (nothing inserted) when its model is no longer there, or disabled.

        Concurrent inserts go to PostgreSQL together (see :mod:`aigcq.asynch.coalesce`)."""
        return await self._inserts.submit((task, running))

    async def _insert_batch(
        self, items: Sequence[tuple[ClaimedTask, bool]]
    ) -> list[bool | Exception]:
        try:
            inserted = await self._insert_rows(items)
            return [task.task_id in inserted for task, _ in items]
        except Exception as exc:
            if len(items) == 1:
                return [exc]
        results: list[bool | Exception] = []  # one bad row must not fail the others
        for item in items:
            try:
                results.append(bool(await self._insert_rows([item])))
            except Exception as exc:
                results.append(exc)
        return results

    async def _insert_rows(self, items: Sequence[tuple[ClaimedTask, bool]]) -> set[str]:
        """The ids of the tasks inserted."""
        rows = [
            {**task.__dict__, "state": int(State.RUNNING if running else State.QUEUED)}
            for task, running in items
        ]
        async with self.pool.connection() as conn:
            cur = await conn.execute(_INSERT, (_json(rows),))
            return {row["task_id"] for row in await cur.fetchall()}

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
        """Record the attempt's outcome (and one model call when ``outcome.called``, and the
        success callback owed when the task has one), all in one statement.

        False when the attempt is stale: the cleaner timed it out meanwhile. Concurrent
        finishes go to PostgreSQL as one statement (see :mod:`aigcq.asynch.coalesce`).
        While PostgreSQL is unreachable the write is retried (with a doubling pause up to
        ``FINISH_RETRY_MAX_PAUSE``), never the attempt: the model is not called again and the
        result not uploaded again; a write whose reply was lost is recognised as done.
        """
        pause = 0.1
        while True:
            try:
                return await self._finishes.submit((task, outcome))
            except psycopg.DataError as exc:  # a value PostgreSQL refuses: record the failure
                reason = exc.diag.message_primary or type(exc).__name__
                log.error(
                    "task %s: its outcome cannot be stored (%s); recording a failure",
                    task.task_id,
                    reason,
                    extra=ctx(task=task.task_id),
                )
                error = f"the result could not be stored: {reason}"
                outcome = Outcome(State.FAILED, outcome.called, error=error)
                continue
            except PG_OUTAGE as exc:
                log.warning(
                    "task %s: recording attempt %d failed (%s); retrying the write",
                    task.task_id,
                    task.attempt,
                    exc,
                    extra=ctx(task=task.task_id),
                )
            while True:
                await asyncio.sleep(pause)
                pause = min(pause * 2, FINISH_RETRY_MAX_PAUSE)
                try:
                    if await self._recorded(task, outcome):
                        return True
                    break
                except PG_OUTAGE:
                    continue

    async def _recorded(self, task: ClaimedTask, outcome: Outcome) -> bool:
        params = {
            "task_id": task.task_id,
            "attempt": task.attempt,
            "state": int(outcome.state),
            "oss_file": outcome.oss_file,
            "error": _storable(outcome.error),
        }
        async with self.pool.connection() as conn:
            cur = await conn.execute(_RECORDED, params)
            return await cur.fetchone() is not None

    async def _finish_rows(
        self, items: Sequence[tuple[ClaimedTask, Outcome]]
    ) -> Sequence[bool | Exception]:
        """The batch as one statement; if PostgreSQL refuses a value in it, row by row, so one
        bad row does not fail the others."""
        try:
            return await self._finish_batch(items)
        except psycopg.DataError as exc:
            if len(items) == 1:
                return [exc]
        results: list[bool | Exception] = []
        for item in items:
            try:
                results += await self._finish_batch([item])
            except psycopg.DataError as exc:
                results.append(exc)
        return results

    async def _finish_batch(self, items: Sequence[tuple[ClaimedTask, Outcome]]) -> list[bool]:
        rows = [
            {
                "task_id": t.task_id,
                "attempt": t.attempt,
                "state": int(o.state),
                "oss_file": o.oss_file,
                "file_type": o.file_type,
                "text": _storable(o.text),
                "error": _storable(o.error),
                "called": o.called,
                "tenant_id": t.tenant_id,
                "creator": t.creator,
                "model_name": t.model_name,
                **_owed_callback(t, o),
            }
            for t, o in items
        ]
        params = (_json(rows),)
        for retry in range(_DEADLOCK_RETRIES + 1):
            try:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(_FINISH, params)
                    done = {(r["task_id"], r["attempt"]) for r in await cur.fetchall()}
                break
            except psycopg.errors.DeadlockDetected:
                # nothing was written; only the cleaner's bulk updates can cross ours
                if retry == _DEADLOCK_RETRIES:
                    raise
        return [(t.task_id, t.attempt) in done for t, _ in items]

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
