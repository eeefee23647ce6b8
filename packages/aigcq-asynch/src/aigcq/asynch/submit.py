"""createTask: validate, pass the queue-limit gate, insert, and start at once if a slot is free."""

from __future__ import annotations

import logging
import uuid

from aigcq.asynch.admission import Admitted
from aigcq.asynch.errors import AsynchError, Code
from aigcq.asynch.identity import Identity
from aigcq.asynch.models_repo import ModelConfig
from aigcq.asynch.process import AsynchProcess
from aigcq.asynch.schemas import TaskCreate
from aigcq.asynch.tasks_repo import ClaimedTask, lease_id
from aigcq.observability.jsonlog import ctx

log = logging.getLogger(__name__)


async def enabled_model(svc: AsynchProcess, name: str) -> ModelConfig:
    """The model's config (cached), refused unless it exists and is enabled."""
    model = await svc.models.config(name)
    if not model.enabled:
        raise AsynchError(Code.MODEL_DISABLED, f"model {model.model_name!r} is disabled")
    return model


async def create_task(svc: AsynchProcess, body: TaskCreate, who: Identity) -> str:
    """Create a task and return its id; on any refusal nothing is left behind."""
    model = await enabled_model(svc, body.model_name)
    task_id = uuid.uuid4().hex
    lease = lease_id(task_id, 1)
    admitted = await svc.admission.take(
        model.model_name, who.tenant_id, task_id, lease, model.queue_limit, model.max_concurrency
    )
    if admitted is Admitted.QUEUE_FULL:
        raise AsynchError(Code.QUEUE_FULL, f"the queue of model {model.model_name!r} is full")
    running = admitted is Admitted.RUNNING
    task = ClaimedTask(
        task_id=task_id,
        model_name=model.model_name,
        tenant_id=who.tenant_id,
        creator=who.creator,
        biz_name=body.biz_name,
        callback_url=str(body.callback_url or ""),
        model_key=body.model_key,
        request_payload=body.request_payload,
        auth_header=who.authorization,
        user_info=who.user_info,
        attempt=1 if running else 0,
    )
    try:
        if not await svc.tasks.insert(task, running=running):  # deleted or disabled since
            svc.models.forget(model.model_name)  # cached: its row says which refusal
            await enabled_model(svc, model.model_name)
            changed = f"model {model.model_name!r} changed meanwhile: send the task again"
            raise AsynchError(Code.MODEL_NOT_FOUND, changed)
    except BaseException:
        await svc.admission.release(
            model.model_name, who.tenant_id, task_id, lease if running else None, gate=True
        )
        raise
    log.debug("task %s: created for model %s (%s)", task_id, model.model_name,
             "started" if running else "queued", extra=ctx(task=task_id))  # fmt: skip
    if running:
        svc.worker.start(task)
    elif not svc.settings.worker_enabled:  # the worker loop, when on, picks it up
        svc.worker.follow(task_id)
    return task_id
