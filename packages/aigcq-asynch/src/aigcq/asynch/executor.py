"""Runs one claimed attempt: call the model, upload the result, record it, free the slots."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
import httpx

from aigcq.asynch.admission import Admission
from aigcq.asynch.callback import Callbacks
from aigcq.asynch.invoke import DEFAULT_MAX_BYTES, CallError, call_model
from aigcq.asynch.lease import LeaseKeeper
from aigcq.asynch.models_repo import ModelConfig, ModelRepo
from aigcq.asynch.result import classify, reply_problem
from aigcq.asynch.semaphore import Semaphore
from aigcq.asynch.states import State
from aigcq.asynch.tasks_repo import PG_OUTAGE, ClaimedTask, Outcome, TaskRepo
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import REDIS_OUTAGE
from aigcq.storage import Storage, StorageError

log = logging.getLogger(__name__)

#: How long an attempt waits for PostgreSQL to read its model's config before failing.
CONFIG_RETRY_SECONDS = 30.0


@dataclass
class Executor:
    http: aiohttp.ClientSession  # model calls (uploads and callbacks use their own clients)
    models: ModelRepo
    tasks: TaskRepo
    storage: Storage
    semaphore: Semaphore
    admission: Admission
    callbacks: Callbacks
    upload_attempts: int
    text_max_chars: int
    reply_max_bytes: int = DEFAULT_MAX_BYTES

    async def run(self, task: ClaimedTask) -> State | None:
        """Run the attempt; the final state, or None when the attempt turned out stale."""
        lease = LeaseKeeper(self.semaphore, task)
        recorded = False
        try:
            outcome = await self._attempt(task)
            # retried while PostgreSQL is away (the lease is kept meanwhile); it also
            # records the callback owed, so what follows cannot lose it
            recorded = await self.tasks.finish(task, outcome)
        finally:
            await lease.stop()
            await self._release(task, recorded)
        if not recorded:
            log.warning(
                "task %s: attempt %d was timed out meanwhile",
                task.task_id,
                task.attempt,
                extra=ctx(task=task.task_id),
            )
            return None
        log.debug("task %s: attempt %d → %s %s", task.task_id, task.attempt, outcome.state.name,
                 outcome.error or outcome.oss_file, extra=ctx(task=task.task_id))  # fmt: skip
        if outcome.state is State.SUCCEEDED and task.callback_url and task.biz_name:
            self.callbacks.wake()
        return outcome.state

    async def _release(self, task: ClaimedTask, recorded: bool) -> None:
        """Free the lease and, with a recorded end, the gate slot (else the cleaner owns the
        task again), in one round trip. Redis being away changes no outcome: the lease
        expires by itself and the cleaner's gate reconciliation frees the slot."""
        try:
            await self.admission.release(
                task.model_name, task.tenant_id, task.task_id, task.lease_id, gate=recorded
            )
        except REDIS_OUTAGE as exc:
            log.warning(
                "task %s: cannot free its slots (Redis: %s); the lease expires and the cleaner"
                " frees the gate slot",
                task.task_id,
                exc,
                extra=ctx(task=task.task_id),
            )

    async def _model(self, task: ClaimedTask) -> ModelConfig:
        """The model's config; while PostgreSQL is unreachable, asked again (nothing was called
        yet, so waiting is safe) for up to ``CONFIG_RETRY_SECONDS``."""
        deadline = asyncio.get_running_loop().time() + CONFIG_RETRY_SECONDS
        pause = 0.1
        while True:
            try:
                return await self.models.config(task.model_name)
            except PG_OUTAGE as exc:
                if asyncio.get_running_loop().time() + pause > deadline:
                    raise
                log.warning(
                    "task %s: cannot read model %s (%s); trying again",
                    task.task_id,
                    task.model_name,
                    exc,
                    extra=ctx(task=task.task_id),
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def _attempt(self, task: ClaimedTask) -> Outcome:
        try:
            model = await self._model(task)
            reply = await call_model(
                self.http,
                model,
                task.task_id,
                task.request_payload,
                task.model_key,
                self.reply_max_bytes,
            )
        except CallError as exc:
            return Outcome(State.FAILED, called=exc.called, error=str(exc))
        except Exception as exc:
            log.exception(
                "task %s: cannot call the model", task.task_id, extra=ctx(task=task.task_id)
            )
            return Outcome(State.FAILED, called=False, error=repr(exc))
        problem = reply_problem(reply.content_type, reply.content, model.response_schemas)
        if problem is not None:
            return Outcome(State.FAILED, called=True, error=problem)
        stored = classify(reply.content_type, reply.content, self.text_max_chars)
        name = f"asynch/{task.task_id}.{stored.ext}"
        try:
            url = await self._upload(task, name, reply.content, stored.content_type)
        except StorageError as exc:
            return Outcome(State.FAILED, called=True, error=str(exc))
        return Outcome(State.SUCCEEDED, True, url, stored.ext, stored.text)

    async def _upload(self, task: ClaimedTask, name: str, data: bytes, content_type: str) -> str:
        headers = {"Authorization": task.auth_header, "X-User-Info": task.user_info}
        delay = 0.2
        for attempt in range(1, self.upload_attempts + 1):
            try:
                return await self.storage.put(name, data, content_type, headers)
            except (StorageError, httpx.HTTPError, OSError) as exc:
                log.warning(
                    "task %s: upload attempt %d failed: %s",
                    task.task_id,
                    attempt,
                    exc,
                    extra=ctx(task=task.task_id),
                )
                if attempt == self.upload_attempts:
                    raise StorageError(f"upload failed {attempt} times: {exc}") from exc
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")
