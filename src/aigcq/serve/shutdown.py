"""Graceful shutdown of a serve process: hand in-flight work back instead of stranding it.

On SIGTERM (see :func:`aigcq.serve.launch.uvicorn_server`) the dispatcher stops claiming at once.
When the app's lifespan ends, :func:`hand_back`:

1. waits up to ``grace_s`` for hand-offs already under way (a platform submit, a
   TASK_ASSIGN being sent) to finish;
2. cancels those still running and requeues their tasks that are still ``dispatching``
   (claimed here, never handed to a target, no create possibly out) at the head of their
   queue, their attempt not charged (the next dispatch has a new attempt number all the same);
3. requeues, the same way, every task assigned to one of this process's bridges that the
   bridge has not acknowledged.

Tasks already running on a bridge or a platform are left alone: their TASK_END reaches
whichever process serves the callback URL. A platform submit cancelled mid-request is
ambiguous (the platform may have accepted it); it is requeued like the rest, as the
alternative is a task that waits for its deadline.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aigcq.domain import TaskState

if TYPE_CHECKING:
    from aigcq.serve.parts import ServeParts

log = logging.getLogger(__name__)

REASON = "aigcq shutting down"


def stop_claiming(service: ServeParts) -> None:
    """Claim no more tasks (safe to call from a signal handler: it only sets a flag)."""
    service.dispatch.stopped = True


async def hand_back(service: ServeParts, grace_s: float) -> list[str]:
    """Requeue (uncharged) what this process claimed but did not hand over, unless a
    create may be out for it (the sweeper resolves that one); the task ids."""
    stop_claiming(service)
    await service.dispatch.drain(timeout=grace_s)
    claims = await service.dispatch.hand_back()
    handed = await service.hub.hand_back(REASON) if service.hub is not None else []
    for c in claims:
        if c.task_id in handed:
            continue
        task = await service.rt.store.reads.get(c.task_id)
        if task is None or task.state is not TaskState.DISPATCHING or task.attempt != c.attempt:
            continue
        if await service.lifecycle.unsent(c.task_id, c.attempt, REASON):
            handed.append(c.task_id)
    if handed:
        log.warning("shutdown: %d task(s) handed back to their queues", len(handed))
    return handed
