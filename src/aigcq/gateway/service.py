"""The gateway's shared state: auth, submission, connected clients, cancel."""

from __future__ import annotations

import logging

from aigcq.config import Settings
from aigcq.delivery.outbox import Outbox
from aigcq.domain import ErrorCode, Task, TaskState
from aigcq.gateway.admission import Admission
from aigcq.gateway.auth import Auth
from aigcq.gateway.clients import ClientHub
from aigcq.gateway.errors import ClientError
from aigcq.gateway.submission import Submission
from aigcq.jsonlog import ctx
from aigcq.runtime import Runtime
from aigcq.scheduler.held import hold, holds, release
from aigcq.scheduler.outcomes import Outcomes

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, rt: Runtime, outcomes: Outcomes) -> None:
        self.rt = rt
        self.outcomes = outcomes
        self.settings: Settings = rt.settings
        self.messages = rt.config.messages
        self.auth = Auth(rt.settings)
        self.admission = Admission(rt.settings, rt.redis, rt.store.keys)
        self.submission = Submission(rt, self.admission)
        self.outbox = Outbox(rt.store.mux, rt.store.keys)
        self.clients = ClientHub(rt.redis, rt.store.keys, self.outbox)

    async def owned_task(self, task_id: str, backend_id: str | None) -> Task:
        """The task, if ``backend_id`` owns it (None: any task). Someone else's task is
        ``TaskNotFound``, exactly like an unknown one."""
        task = await self.rt.store.get(task_id)
        if task is None or (backend_id is not None and task.backend_id != backend_id):
            raise ClientError(ErrorCode.NOT_FOUND, "no such task", task_id)
        return task

    async def cancel(self, task_id: str, backend_id: str | None) -> str:
        """Cancel a live task (``backend_id`` None = admin). Returns the resulting state."""
        task = await self.owned_task(task_id, backend_id)
        adapter = self.rt.platforms.adapters.get(task.target)
        # a running task its platform cannot cancel keeps its slot until it ends there
        held = adapter is not None and task.state is TaskState.RUNNING and holds(adapter, task)
        if held and adapter is not None:
            await hold(self.rt, adapter, task, "cancelled")
        done = await self.rt.store.finish(
            task_id,
            TaskState.CANCELLED,
            message=self.outcomes.error_body(ErrorCode.TASK_CANCELLED),
            note="cancelled by client" if backend_id else "cancelled by admin",
        )
        if not done.applied:
            if held and adapter is not None:
                await release(self.rt, task.aigc, adapter.name, task.remote_id)
            raise ClientError(ErrorCode.GONE, f"task already {done.state}", task_id)
        if adapter is not None and task.remote_id:
            account = self.rt.config.account(task.aigc, task.platform)
            await self.rt.platforms.cancel(adapter, task, account.apikey if account else "")
        log.info("task %s: cancelled", task_id, extra=ctx(task=task_id))
        return TaskState.CANCELLED.value

    async def aclose(self) -> None:
        await self.admission.aclose()
