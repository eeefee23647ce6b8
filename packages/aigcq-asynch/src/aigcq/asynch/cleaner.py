"""One cleaner pass (cleanWork, or the loop with ``AIGCQ_ASYNCH_CLEANER_ENABLED``).

Rules, in order:

1. state 4 whose ``expire_at`` has passed → deleted;
2. state 3 with no retry left (``retry_count >= retry_times``) and finished more than
   ``auto_clean_seconds`` ago → deleted (the delay lets the business see the failure);
   state 3 of a model deleted since → deleted a day after it failed. With local storage the
   result files of deleted tasks are deleted too (when they are in this process's folder);
3. state 1 running longer than ``timeout_seconds`` + grace, and state 0 queued longer than
   ``queue_timeout_seconds`` → state 3 (their gate and semaphore slots are released);
   state 1 whose holder died (its semaphore lease gone at two looks in a row) → state 0 at
   the head of the queue, no retry used (:meth:`Cleaner.reclaim`, also run by every
   serving process every half lease);
4. state 3 with retries left → state 0 with ``retry_count + 1`` once the gate gives it a slot
   again: to the head of the queue when ``retry_queue_max_seconds`` is 0 or the task is older
   than that, else to the tail; a queued retry that has waited longer than
   ``retry_queue_max_seconds`` is moved to the head;
5. the queue-limit gates are reconciled with the rows (slots of tasks that are no longer
   queued or running are freed; live tasks missing from a gate get their slot back);
6. success callbacks given up on more than 7 days ago are deleted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import KW_ONLY, asdict, dataclass, field

from aigcq.asynch.db import Pool, Row
from aigcq.asynch.gate import QueueGate
from aigcq.asynch.rebuild import Rebuild
from aigcq.asynch.runtime import semaphore_key
from aigcq.asynch.semaphore import Semaphore
from aigcq.asynch.tasks_repo import lease_id
from aigcq.observability.jsonlog import ctx
from aigcq.storage.local import LocalStorage

log = logging.getLogger(__name__)

_DELETE_DOWNLOADED = (
    "DELETE FROM asynch_task WHERE state = 4 AND expire_at < now() RETURNING oss_file"
)
_DELETE_EXHAUSTED = """
DELETE FROM asynch_task t USING asynch_models m
WHERE t.state = 3 AND m.model_name = t.model_name AND t.retry_count >= m.retry_times
  AND t.finished_at < now() - make_interval(secs => m.auto_clean_seconds)
RETURNING t.oss_file
"""
_DELETE_ORPHANED = """
DELETE FROM asynch_task t WHERE t.state = 3 AND t.finished_at < now() - interval '1 day'
  AND NOT EXISTS (SELECT 1 FROM asynch_models m WHERE m.model_name = t.model_name)
RETURNING t.oss_file
"""
# Callbacks given up on are kept a week for the stats, then forgotten.
_DELETE_GIVEN_UP_CALLBACKS = """
DELETE FROM asynch_callback WHERE state = 2 AND updated_at < now() - interval '7 days'
"""
_TIME_OUT = """
UPDATE asynch_task t SET state = 3, finished_at = now(), updated_at = now(),
    error = CASE WHEN t.state = 1 THEN 'timed out after ' || m.timeout_seconds || ' s running'
                 ELSE 'timed out in the queue' END
FROM asynch_models m
WHERE m.model_name = t.model_name AND (
    (t.state = 1 AND t.started_at
        < now() - make_interval(secs => m.timeout_seconds + %(grace)s))
    OR (t.state = 0 AND t.enqueue_at < now() - make_interval(secs => %(queue_timeout)s)))
RETURNING t.task_id, t.model_name, t.tenant_id, t.attempt
"""
_RETRY_CANDIDATES = """
SELECT t.task_id, t.model_name, m.queue_limit,
       (m.retry_queue_max_seconds = 0
        OR t.created_at < now() - make_interval(secs => m.retry_queue_max_seconds)) AS head
FROM asynch_task t JOIN asynch_models m ON m.model_name = t.model_name
WHERE t.state = 3 AND t.retry_count < m.retry_times
ORDER BY t.finished_at LIMIT 1000 FOR UPDATE OF t SKIP LOCKED
"""
_REQUEUE = """
UPDATE asynch_task SET state = 0, retry_count = retry_count + 1, enqueue_at = now(),
    priority = CASE WHEN task_id = ANY(%(head)s) THEN 1 ELSE 0 END,
    started_at = NULL, finished_at = NULL, updated_at = now()
WHERE task_id = ANY(%(ids)s)
"""
_PROMOTE = """
UPDATE asynch_task t SET priority = 1, updated_at = now() FROM asynch_models m
WHERE t.state = 0 AND t.retry_count > 0 AND t.priority = 0 AND m.model_name = t.model_name
  AND m.retry_queue_max_seconds > 0
  AND t.enqueue_at < now() - make_interval(secs => m.retry_queue_max_seconds)
"""


# Running attempts old enough to have renewed their lease at least once.
_RUNNING = """
SELECT task_id, model_name, tenant_id, attempt FROM asynch_task
WHERE state = 1 AND started_at < now() - make_interval(secs => %s)
ORDER BY started_at LIMIT 1000
"""
# Back to the head of the queue, same retry_count: the holder died, the model call did not fail.
_RECLAIM = """
UPDATE asynch_task t SET state = 0, priority = 1, started_at = NULL, updated_at = now()
FROM unnest(%s::text[], %s::int[]) AS d(task_id, attempt)
WHERE t.task_id = d.task_id AND t.state = 1 AND t.attempt = d.attempt
RETURNING t.task_id
"""


@dataclass
class CleanReport:
    deleted_downloaded: int = 0
    deleted_failed: int = 0
    timed_out: int = 0
    reclaimed: int = 0
    requeued: int = 0
    promoted: int = 0
    gate_released: int = 0
    gate_restored: int = 0
    files_deleted: int = 0
    callbacks_deleted: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(eq=False)
class Cleaner:
    pool: Pool
    gate: QueueGate
    semaphore: Semaphore
    _: KW_ONLY
    running_grace: float
    queue_timeout: float
    gate_grace: float
    files: LocalStorage | None = None
    rebuild: Rebuild | None = None
    #: leases found gone at the last look
    _dead: set[tuple[str, int]] = field(init=False, default_factory=set)

    async def run_once(self) -> CleanReport:
        report = CleanReport()
        async with self.pool.connection() as conn:
            downloaded = await (await conn.execute(_DELETE_DOWNLOADED)).fetchall()
            failed = await (await conn.execute(_DELETE_EXHAUSTED)).fetchall()
            failed += await (await conn.execute(_DELETE_ORPHANED)).fetchall()
            report.callbacks_deleted = (await conn.execute(_DELETE_GIVEN_UP_CALLBACKS)).rowcount
        report.deleted_downloaded, report.deleted_failed = len(downloaded), len(failed)
        if self.files is not None:
            urls = (r["oss_file"] for r in [*downloaded, *failed] if r["oss_file"])
            report.files_deleted = await self.files.remove_urls(urls)
        report.timed_out = await self._time_out()
        report.reclaimed = len(await self.reclaim())
        report.requeued = await self._requeue()
        async with self.pool.connection() as conn:
            report.promoted = (await conn.execute(_PROMOTE)).rowcount
        report.gate_released, report.gate_restored = await self._reconcile_gates()
        if any(report.as_dict().values()):
            log.info("cleaner: %s", report.as_dict())
        return report

    async def _time_out(self) -> int:
        params = {"grace": self.running_grace, "queue_timeout": self.queue_timeout}
        async with self.pool.connection() as conn:
            rows = await (await conn.execute(_TIME_OUT, params)).fetchall()
        for row in rows:
            log.warning(
                "task %s: timed out, marked failed", row["task_id"], extra=ctx(task=row["task_id"])
            )
            await self.gate.release(row["model_name"], row["task_id"])
            lease = lease_id(row["task_id"], row["attempt"])
            await self.semaphore.release(row["model_name"], row["tenant_id"], lease)
        return len(rows)

    async def reclaim(self) -> list[str]:
        """Requeue running attempts whose holder died: their semaphore lease is gone (a live
        holder renews it every third of its length, and puts it back if it was lost) at two
        looks in a row. They go to the head of the queue without using a retry (the model
        call did not fail); the next claim's attempt number fences the old holder.
        Returns the requeued task ids."""
        if self.rebuild is not None:
            await self.rebuild()  # leases missing because Redis lost its data are not deaths
        async with self.pool.connection() as conn:
            cur = await conn.execute(_RUNNING, (self.semaphore.lease_seconds,))
            rows = await cur.fetchall()
        if not rows:
            self._dead.clear()
            return []
        pipe = self.semaphore.redis.pipeline(transaction=False)
        for r in rows:
            pipe.zscore(
                semaphore_key(r["model_name"], r["tenant_id"]), lease_id(r["task_id"], r["attempt"])
            )
        now = time.time()
        gone = {
            (r["task_id"], int(r["attempt"]))
            for r, score in zip(rows, await pipe.execute(), strict=True)
            if score is None or float(score) < now
        }
        dead, self._dead = gone & self._dead, gone - self._dead
        if not dead:
            return []
        ids, attempts = zip(*sorted(dead), strict=True)
        async with self.pool.connection() as conn:
            cur = await conn.execute(_RECLAIM, (list(ids), list(attempts)))
            requeued = [r["task_id"] for r in await cur.fetchall()]
        for task_id in requeued:
            log.warning(
                "task %s: its worker died (lease gone); requeued at the head, no retry used",
                task_id,
                extra=ctx(task=task_id),
            )
        return requeued

    async def _requeue(self) -> int:
        async with self.pool.connection() as conn, conn.transaction():
            candidates = await (await conn.execute(_RETRY_CANDIDATES)).fetchall()
            admitted = [c for c in candidates if await self._take_gate(c)]
            if not admitted:
                return 0
            head = [c["task_id"] for c in admitted if c["head"]]
            ids = [c["task_id"] for c in admitted]
            await conn.execute(_REQUEUE, {"head": head, "ids": ids})
        for task_id in ids:
            log.info("task %s: requeued for a retry", task_id, extra=ctx(task=task_id))
        return len(ids)

    async def _take_gate(self, candidate: Row) -> bool:
        model, task_id = candidate["model_name"], candidate["task_id"]
        return await self.gate.take(model, task_id, candidate["queue_limit"])

    async def _reconcile_gates(self) -> tuple[int, int]:
        released = restored = 0
        cutoff = time.time() - self.gate_grace
        async with self.pool.connection() as conn:
            for model in await self.gate.models():
                holders = await self.gate.holders(model, cutoff)
                if holders:
                    cur = await conn.execute(
                        "SELECT task_id FROM asynch_task WHERE task_id = ANY(%s)"
                        " AND state IN (0, 1)",
                        (holders,),
                    )
                    live = {r["task_id"] for r in await cur.fetchall()}
                    stale = [h for h in holders if h not in live]
                    await self.gate.release(model, *stale)
                    released += len(stale)
            cur = await conn.execute(
                "SELECT model_name, array_agg(task_id) AS ids FROM asynch_task"
                " WHERE state IN (0, 1) GROUP BY model_name"
            )
            for row in await cur.fetchall():
                restored += await self.gate.restore(row["model_name"], row["ids"])
        return released, restored
