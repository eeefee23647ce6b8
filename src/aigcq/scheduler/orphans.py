"""Remote tasks we no longer want: cancelled on their platform, counted until they end.

A remote task becomes an orphan when its task moved on while it may still run on a paid
platform (a client cancel, an older attempt's success, a create accepted after the task
left ``dispatching``, a retry after the deadline). The queue scripts keep it in its
account's cap atomically with that move; here it is cancelled (the adapter's
``cancel_request``; a platform with none lets it finish) and then watched: each check asks
the platform, and
only its word that the task ended (a result, a failure, "not found") frees the slot —
or the run's own webhook, whose TASK_END releases that attempt's orphan in the finishing
script. A create still out when its task moved on (no remote id yet) is counted as
``create:<createId>``: its reply names the remote task (then cancelled), its webhook
ends it, or it is freed once the platform's maximum run time (``AIGCQ_PAID_MAX_RUN_S``)
has passed since the create: a retry at the task's deadline must not run beside it.
"""

from __future__ import annotations

import logging

from aigcq.domain import Task
from aigcq.observability.jsonlog import ctx
from aigcq.queue.store import Orphan
from aigcq.runtime import Runtime

log = logging.getLogger(__name__)


class Orphans:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def cancel(self, o: Orphan) -> None:
        """Ask the platform to cancel an orphan (nothing where it has no cancel, or while
        its remote id is not known: it is cancelled once the create's reply names it)."""
        adapter = self.rt.platforms.adapters.get(o.target)
        if adapter is None:
            return
        if o.awaiting_create:
            log.info(
                "task %s: attempt %s unwanted while its create's outcome is unknown; counted "
                "until its reply, its webhook or the platform's maximum run time",
                o.task_id,
                o.attempt,
                extra=ctx(task=o.task_id),
            )
            return
        sent = await self.rt.platforms.cancel(
            adapter, as_task(o), self.rt.apikey(o.aigc, o.platform)
        )
        log.info(
            "task %s: remote task %s of attempt %s unwanted; %s",
            o.task_id,
            o.remote_id,
            o.attempt,
            "cancel sent" if sent else "left to finish (counted until it ends)",
            extra=ctx(task=o.task_id),
        )


def orphan_of(task: Task, remote_id: str) -> Orphan:
    """The orphan a task's remote task became (for the caller that made it one)."""
    return Orphan(
        remote_id,
        task.task_id,
        task.attempt,
        task.aigc,
        task.platform,
        task.target,
        task.workflow_id,
    )


def as_task(o: Orphan) -> Task:
    """What an adapter needs to query or cancel the remote task."""
    return Task(
        task_id=o.task_id,
        platform=o.platform,
        aigc=o.aigc,
        backend_id="",
        payload={},
        attempt=o.attempt,
        target=o.target,
        remote_id=o.remote_id,
        workflow_id=o.workflow_id,
    )
