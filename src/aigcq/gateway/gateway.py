"""The gateway's shared state: auth, submission, connected clients, cancel, estimates."""

from __future__ import annotations

import time
from typing import Any

from aigcq.config import Settings
from aigcq.delivery.outbox import Outbox
from aigcq.domain import ErrorCode, Task, TaskState
from aigcq.gateway.admission import Admission
from aigcq.gateway.clients import ClientHub
from aigcq.gateway.errors import ClientError
from aigcq.gateway.queue_updates import QueueUpdates
from aigcq.gateway.submission import GenerateRequest, Submission
from aigcq.plumbing.auth import Auth
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.targets import InternalTarget


class Gateway:
    def __init__(
        self, rt: Runtime, lifecycle: Lifecycle, internal: InternalTarget | None = None
    ) -> None:
        """``internal``: our GPUs, whose queues' positions and ETAs the estimates give."""
        self.rt = rt
        self.lifecycle = lifecycle
        self.settings: Settings = rt.settings
        self.messages = rt.config.messages
        self.auth = Auth(rt.settings)
        self.admission = Admission(rt.settings, rt.redis, rt.store.keys)
        self.submission = Submission(rt, lifecycle, self.admission)
        self.outbox = Outbox(
            rt.store.mux, rt.store.keys, retention_s=rt.settings.outbox_retention_s
        )
        self.clients = ClientHub(rt.redis, rt.store.keys, self.outbox, lifecycle.traces)
        self.queue_updates = QueueUpdates(rt, self.clients, internal)

    def estimate(self, req: GenerateRequest, created: bool) -> dict[str, Any]:
        """``position`` and ``etaStartMs`` of a task just submitted (a duplicate: as the
        last estimate saw it), from the last estimate: no I/O on the submit path."""
        queue = (req.AIGC or self.settings.project_prefix, req.platform)
        if not created:
            return self.queue_updates.estimator.of(req.taskId, queue, None).wire(time.time())
        return self.queue_updates.submitted(req.taskId, queue)

    async def owned_task(self, task_id: str, owners: frozenset[str] | None) -> Task:
        """The task, if one of ``owners`` (backendIds) owns it (None: any task). Someone
        else's task is ``TaskNotFound``, exactly like an unknown one."""
        task = await self.rt.store.reads.get(task_id)
        if task is None or (owners is not None and task.backend_id not in owners):
            raise ClientError(ErrorCode.NOT_FOUND, "no such task", task_id)
        return task

    async def cancel(self, task_id: str, owners: frozenset[str] | None) -> str:
        """Cancel a live task of one of ``owners`` (None = admin). Returns the resulting
        state."""
        task = await self.owned_task(task_id, owners)
        done = await self.lifecycle.cancelled(task, by_client=owners is not None)
        if not done.applied:
            raise ClientError(ErrorCode.GONE, f"task already {done.state}", task_id)
        return TaskState.CANCELLED.value

    async def aclose(self) -> None:
        await self.admission.aclose()
