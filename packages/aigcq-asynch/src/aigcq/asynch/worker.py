"""Claims queued tasks and runs them: on demand (runWork, createTask) or as a loop.

* :meth:`Worker.run_once` claims one batch with ``FOR UPDATE SKIP LOCKED`` (any number of
  processes may do so at once) and runs it.
* :meth:`Worker.follow` is createTask's directed poll: every ``interval`` seconds, only while
  the task is still queued, try to claim that one task.
* :meth:`Worker.loop` is the optional background worker (``AIGCQ_ASYNCH_WORKER_ENABLED``): it
  claims whenever it has free capacity, waking on a finished task or every ``interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import KW_ONLY, dataclass, field

from aigcq.asynch.executor import Executor
from aigcq.asynch.semaphore import Semaphore
from aigcq.asynch.states import State
from aigcq.asynch.tasks_repo import ClaimedTask, TaskRepo, lease_id
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import round_failed
from aigcq.plumbing.cancel import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Worker:
    tasks: TaskRepo
    executor: Executor
    semaphore: Semaphore
    _: KW_ONLY
    interval: float
    batch_size: int
    capacity: int
    _running: set[asyncio.Task[State | None]] = field(init=False, default_factory=set)
    _followers: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _wake: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    async def admit(self, task_id: str, model: str, tenant: str, attempt: int, cap: int) -> bool:
        """Take the semaphore lease the attempt will run under."""
        return await self.semaphore.acquire(model, tenant, lease_id(task_id, attempt), cap)

    def start(self, task: ClaimedTask) -> asyncio.Task[State | None]:
        """Run a claimed attempt in the background."""
        job = asyncio.create_task(self.executor.run(task), name=f"asynch-task-{task.task_id}")
        self._running.add(job)
        job.add_done_callback(self._done)
        return job

    async def run_once(self, limit: int | None = None) -> list[asyncio.Task[State | None]]:
        """Claim one batch and start it; returns the started jobs."""
        return (await self._claim(limit or self.batch_size))[0]

    async def _claim(self, limit: int) -> tuple[list[asyncio.Task[State | None]], int]:
        claim = await self.tasks.claim(self.admit, limit)
        return [self.start(ClaimedTask.from_row(r)) for r in claim.rows], claim.candidates

    def follow(self, task_id: str) -> None:
        """Poll ``task_id`` lightly until it is claimed by anyone or leaves state 0."""
        job = asyncio.create_task(self._follow(task_id))
        self._followers.add(job)
        job.add_done_callback(self._followers.discard)

    async def _follow(self, task_id: str) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if await self.tasks.state_of(task_id) != State.QUEUED:
                    return
                claim = await self.tasks.claim(self.admit, 1, task_id)
            except Exception:
                log.exception(
                    "task %s: directed poll failed; retrying", task_id, extra=ctx(task=task_id)
                )
                continue
            if claim.rows:
                self.start(ClaimedTask.from_row(claim.rows[0]))
                return

    async def loop(self) -> None:
        """The background worker: keep up to ``capacity`` attempts running.

        After a pass that started tasks it claims again at once; when tasks were queued but
        none could start (limits reached) it waits for a local attempt to finish or for
        ``interval``; when the queue was empty it sleeps ``interval``.
        """
        while True:
            self._wake.clear()
            free = self.capacity - len(self._running)
            started: list[asyncio.Task[State | None]] = []
            queued = 1
            if free > 0:
                try:
                    started, queued = await self._claim(min(free, self.batch_size))
                except Exception as exc:
                    round_failed(log, "worker pass failed", exc)
            if started and len(started) < free:
                continue
            if queued:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)
            else:
                await asyncio.sleep(self.interval)

    def wake(self) -> None:
        """Claim now: queued work appeared (e.g. the task of a dead worker)."""
        self._wake.set()

    def _done(self, job: asyncio.Task[State | None]) -> None:
        self._running.discard(job)
        self._wake.set()
        if not job.cancelled() and job.exception() is not None:
            log.error("attempt crashed", exc_info=job.exception())

    async def aclose(self) -> None:
        """Stop following and cancel running attempts (the cleaner fails and retries them)."""
        await cancel_and_wait([*self._followers, *self._running])
