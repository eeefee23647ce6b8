"""Remote tasks we no longer want: cancelled on their platform, counted until they end.

A remote task becomes an orphan when its task moved on while it may still run on a paid
platform (a client cancel, an older attempt's success, a create accepted after the task
left ``dispatching``, a retry after the deadline). The queue scripts keep it in its
account's cap atomically with that move; here it is cancelled (RunningHub's cancel; Coze
has none, so it is left to finish) and then watched: each check asks the platform, and
only its word that the task ended (a result, a failure, "not found") frees the slot —
or the run's own webhook, whose TASK_END releases that attempt's orphan in the finishing
script. A create still out when its task moved on (no remote id yet) is counted as
``create:<createId>``: its reply names the remote task (then cancelled), its webhook
ends it, or it is freed at the deadline the sweeper gives such a create.
"""

from __future__ import annotations

import logging
import time

from aigcq.domain import Task
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Failed, NotFound, Succeeded
from aigcq.queue.store import Orphan
from aigcq.service.runtime import Runtime

log = logging.getLogger(__name__)

#: seconds between two checks of one orphan
RECHECK_S = 2.0


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
                "until its reply, its webhook or its deadline",
                o.task_id,
                o.attempt,
                extra=ctx(task=o.task_id),
            )
            return
        sent = await self.rt.platforms.cancel(adapter, _as_task(o), self._apikey(o))
        log.info(
            "task %s: remote task %s of attempt %s unwanted; %s",
            o.task_id,
            o.remote_id,
            o.attempt,
            "cancel sent" if sent else "left to finish (counted until it ends)",
            extra=ctx(task=o.task_id),
        )

    async def check_due(self) -> int:
        """Ask the platform about every orphan due for a check; the number released."""
        released = 0
        for aigc, target in self._accounts():
            for o in await self.rt.store.orphans_due(aigc, target):
                released += await self._check(o)
        return released

    async def _check(self, o: Orphan) -> int:
        adapter = self.rt.platforms.adapters.get(o.target)
        if adapter is None:
            return int(await self.rt.store.release_orphan(o.remote_id))
        if o.awaiting_create:
            return await self._check_create(o)
        # peek: the result is nobody's, so inline files are not stored
        outcome = await self.rt.platforms.peek(adapter, _as_task(o), self._apikey(o))
        if isinstance(outcome, Succeeded | Failed | NotFound):
            log.info(
                "task %s: unwanted remote task %s ended (%s)",
                o.task_id,
                o.remote_id,
                type(outcome).__name__,
                extra=ctx(task=o.task_id),
            )
            return int(await self.rt.store.release_orphan(o.remote_id))
        await self.cancel(o)  # still running (or no answer): ask again
        await self.rt.store.check_orphan_later(o, RECHECK_S)
        return 0

    async def _check_create(self, o: Orphan) -> int:
        """A create with no remote id: the platform cannot be asked about it, so it is
        counted until the task's deadline from the create (the rule that fails such a
        task with ``UncertainSubmit``), unless its reply or webhook resolved it first."""
        account = self.rt.config.account(o.aigc, o.platform)
        left = o.create_at + self.rt.deadline_s(account) - time.time()
        if left > 0:
            await self.rt.store.check_orphan_later(o, min(left, RECHECK_S))
            return 0
        log.warning(
            "task %s: the create of attempt %s was never resolved by its deadline; its slot "
            "is free again",
            o.task_id,
            o.attempt,
            extra=ctx(task=o.task_id),
        )
        return int(await self.rt.store.release_orphan(o.remote_id))

    def _accounts(self) -> set[tuple[str, str]]:
        """(AIGC, paid target) of every configured queue."""
        found = set()
        for aigc, platform in self.rt.config.queues():
            adapter = self.rt.platforms.adapter_for(platform)
            if adapter is not None and adapter.paid:
                found.add((aigc, adapter.name))
        return found

    def _apikey(self, o: Orphan) -> str:
        account = self.rt.config.account(o.aigc, o.platform)
        return account.apikey if account else ""


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


def _as_task(o: Orphan) -> Task:
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
