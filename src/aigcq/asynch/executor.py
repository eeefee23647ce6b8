"""Runs one claimed attempt: call the model, upload the result, record it, free the slots."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
import httpx

from aigcq.asynch.admission import Admission
from aigcq.asynch.callback import Callbacks, callback_request
from aigcq.asynch.gate import QueueGate
from aigcq.asynch.invoke import CallError, call_model
from aigcq.asynch.lease import LeaseKeeper
from aigcq.asynch.models_repo import ModelRepo
from aigcq.asynch.result import classify
from aigcq.asynch.semaphore import Semaphore
from aigcq.asynch.states import State
from aigcq.asynch.tasks_repo import ClaimedTask, Outcome, TaskRepo
from aigcq.observability.jsonlog import ctx
from aigcq.storage import Storage, StorageError

log = logging.getLogger(__name__)


@dataclass
class Executor:
    http: aiohttp.ClientSession  # model calls (uploads and callbacks use their own clients)
    models: ModelRepo
    tasks: TaskRepo
    storage: Storage
    gate: QueueGate
    semaphore: Semaphore
    admission: Admission
    callbacks: Callbacks
    upload_attempts: int
    text_max_chars: int

    async def run(self, task: ClaimedTask) -> State | None:
        """Run the attempt; the final state, or None when the attempt turned out stale."""
        lease = LeaseKeeper(self.semaphore, task)
        try:
            outcome = await self._attempt(task)
        finally:
            await lease.stop()
        recorded = False
        try:
            recorded = await self.tasks.finish(task, outcome)
        finally:
            # the lease always goes; the gate slot only with a recorded end (else the cleaner
            # owns the task again), both in one round trip
            await self.admission.release(
                task.model_name, task.tenant_id, task.task_id, task.lease_id, gate=recorded
            )
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
            self._callback(task, outcome)
        return outcome.state

    async def _attempt(self, task: ClaimedTask) -> Outcome:
        try:
            model = await self.models.config(task.model_name)
            reply = await call_model(
                self.http, model, task.task_id, task.request_payload, task.model_key
            )
        except CallError as exc:
            return Outcome(State.FAILED, called=exc.called, error=str(exc))
        except Exception as exc:
            log.exception(
                "task %s: cannot call the model", task.task_id, extra=ctx(task=task.task_id)
            )
            return Outcome(State.FAILED, called=False, error=repr(exc))
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

    def _callback(self, task: ClaimedTask, outcome: Outcome) -> None:
        url, params = callback_request(
            task.callback_url,
            task.biz_name,
            task_id=task.task_id,
            state=int(outcome.state),
            oss_file=outcome.oss_file or "",
            file_type=outcome.file_type or "",
            text=outcome.text,
        )
        self.callbacks.send(task.task_id, url, params)
