"""The success callback: ``GET {callbackUrl}/{bizName}?task_id&state&oss_file&file_type&text``.

The callback a success owes is written to ``asynch_callback`` by the very statement that
records the success (:mod:`aigcq.asynch.tasks_repo`), so it follows from durable state: a
Redis failure while the task's slots are freed, or a process that stops, cannot lose it.
:class:`Callbacks` is the sender loop every serving process runs: it claims owed rows
(``FOR UPDATE SKIP LOCKED``, then a lease on the row by pushing ``next_at``), sends them with a
doubling pause between tries, deletes delivered rows (those finishing together by one
statement, :class:`~aigcq.asynch.coalesce.Coalescer`) and marks a row given up (state 2)
after ``attempts`` tries; those stay visible in stats (:meth:`Callbacks.counts`). Delivery is
at least once: a sender that dies between sending and recording sends again after the lease.
``text`` is cut to 2000 characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from aigcq.asynch.coalesce import Coalescer
from aigcq.asynch.db import Pool, Row
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.cancel import cancel_and_wait

log = logging.getLogger(__name__)

TEXT_MAX_CHARS = 2000
SEND_TIMEOUT = 10.0
#: A claimed row is not claimed again for this long (longer than one send can take).
CLAIM_LEASE_SECONDS = 3 * SEND_TIMEOUT
MAX_IN_FLIGHT = 200

OWED, GIVEN_UP = 0, 2

_CLAIM = """
UPDATE asynch_callback c
SET attempts = c.attempts + 1, updated_at = now(),
    next_at = now() + make_interval(secs => %(lease)s)
WHERE c.id IN (
    SELECT id FROM asynch_callback WHERE state = 0 AND next_at <= now()
    ORDER BY next_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING c.id, c.task_id, c.url, c.params, c.attempts
"""
_DELIVERED = "DELETE FROM asynch_callback WHERE id = ANY(%s)"
_FAILED = """
UPDATE asynch_callback SET last_error = %(error)s, updated_at = now(),
    state = CASE WHEN attempts >= %(max)s THEN 2 ELSE 0 END,
    next_at = now() + make_interval(secs => %(pause)s)
WHERE id = %(id)s RETURNING state
"""
_COUNTS = "SELECT state, count(*) AS n FROM asynch_callback GROUP BY state"


def callback_request(
    callback_url: str,
    biz_name: str,
    *,
    task_id: str,
    state: int,
    oss_file: str,
    file_type: str,
    text: str | None,
) -> tuple[str, dict[str, str]]:
    """The URL and query parameters of one callback."""
    url = f"{callback_url.rstrip('/')}/{quote(biz_name, safe='')}"
    params = {"task_id": task_id, "state": str(state), "oss_file": oss_file, "file_type": file_type}
    if text:
        params["text"] = text[:TEXT_MAX_CHARS]
    return url, params


@dataclass(eq=False)
class Callbacks:
    """The sender loop over ``asynch_callback`` (see the module docstring)."""

    pool: Pool
    client: httpx.AsyncClient
    attempts: int
    backoff: float
    poll_seconds: float = 1.0
    _sending: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _wake: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    #: delivered rows finishing together are deleted by one statement
    _deletes: Coalescer[int, None] = field(init=False)

    def __post_init__(self) -> None:
        self._deletes = Coalescer(self._delete_rows)

    def wake(self) -> None:
        """A callback was just recorded: look now rather than at the next poll."""
        self._wake.set()

    async def loop(self) -> None:
        while True:
            self._wake.clear()
            claimed = 0
            try:
                claimed = await self.run_once()
            except Exception as exc:
                log.warning("callback pass failed (%s); trying again", exc)
            if claimed and len(self._sending) < MAX_IN_FLIGHT:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_seconds)

    async def run_once(self) -> int:
        """Claim the due callbacks (up to the free sending capacity) and start sending them."""
        free = MAX_IN_FLIGHT - len(self._sending)
        if free <= 0:
            return 0
        async with self.pool.connection() as conn:
            cur = await conn.execute(_CLAIM, {"lease": CLAIM_LEASE_SECONDS, "limit": free})
            rows = await cur.fetchall()
        for row in rows:
            job = asyncio.create_task(self._deliver(row))
            self._sending.add(job)
            job.add_done_callback(self._sending.discard)
        return len(rows)

    async def drain(self) -> None:
        """Wait for the sends in flight (tests)."""
        while self._sending:
            await asyncio.wait(list(self._sending))

    async def _deliver(self, row: Row) -> None:
        task_id, url, attempt = row["task_id"], row["url"], int(row["attempts"])
        params: dict[str, Any] = row["params"]
        try:
            response = await self.client.get(url, params=params, timeout=SEND_TIMEOUT)
            problem = None if response.status_code < 300 else f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            problem = repr(exc)
        try:
            await self._record(row["id"], task_id, url, attempt, problem)
        except Exception as exc:  # the row's lease runs out and it is sent again
            log.warning(
                "task %s: cannot record callback attempt %d (%s); it will be sent again",
                task_id,
                attempt,
                exc,
                extra=ctx(task=task_id),
            )

    async def _record(
        self, row_id: int, task_id: str, url: str, attempt: int, problem: str | None
    ) -> None:
        if problem is None:
            await self._deletes.submit(row_id)
            log.info("task %s: callback delivered to %s", task_id, url, extra=ctx(task=task_id))
            return
        async with self.pool.connection() as conn:
            pause = self.backoff * 2 ** (attempt - 1)
            cur = await conn.execute(
                _FAILED, {"id": row_id, "error": problem, "max": self.attempts, "pause": pause}
            )
            state = (await cur.fetchone() or {"state": OWED})["state"]
        if state != GIVEN_UP:
            asyncio.get_running_loop().call_later(pause, self.wake)
        if state == GIVEN_UP:
            log.error(
                "task %s: callback to %s abandoned after %d attempts: %s",
                task_id,
                url,
                attempt,
                problem,
                extra=ctx(task=task_id),
            )
        else:
            log.warning(
                "task %s: callback attempt %d to %s failed: %s",
                task_id,
                attempt,
                url,
                problem,
                extra=ctx(task=task_id),
            )

    async def _delete_rows(self, row_ids: Sequence[int]) -> list[None]:
        async with self.pool.connection() as conn:
            await conn.execute(_DELIVERED, (list(row_ids),))
        return [None] * len(row_ids)

    async def counts(self) -> dict[str, int]:
        """Callbacks owed (not delivered yet) and given up."""
        async with self.pool.connection() as conn:
            rows = await (await conn.execute(_COUNTS)).fetchall()
        by_state = {int(r["state"]): int(r["n"]) for r in rows}
        return {"owed": by_state.get(OWED, 0), "failed": by_state.get(GIVEN_UP, 0)}

    async def aclose(self) -> None:
        """Cancel the sends in flight (their rows are sent again after their lease)."""
        await cancel_and_wait(list(self._sending))
