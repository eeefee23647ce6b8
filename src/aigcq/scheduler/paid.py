"""The paid platforms (RunningHub, Coze, JimuAI) as one target: per-account caps, creates.

A queue's platform is served by one adapter (:meth:`PlatformClient.adapter_for`) under the
AIGC project's account (``config/model.json``: apikey, concurrency). The account's cap holds
in the claim script: its running tasks plus the unwanted remote tasks still counted
(orphans). Before each create its intent is recorded (:meth:`Lifecycle.creating`), so a
process that dies while the create is out is known to have one out; what the platform
answers is the lifecycle's to apply.
"""

from __future__ import annotations

import logging
import uuid

from aigcq.platforms.base import Accepted, Full, NotSent, PlatformAdapter, Rejected, Uncertain
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.ends import TaskEnd
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.routing import capped
from aigcq.scheduler.targets import HandBack

log = logging.getLogger(__name__)


class PaidPlatforms:
    """Every configured paid platform account, behind one :class:`Target`."""

    name = "paid"

    def __init__(self, rt: Runtime, lifecycle: Lifecycle) -> None:
        self.rt = rt
        self.lifecycle = lifecycle

    def adapter_for(self, platform: str) -> PlatformAdapter | None:
        return self.rt.platforms.adapter_for(platform)

    def cap(self, aigc: str, platform: str) -> int:
        """How many tasks of the queue may run on its platform at once (0: none serves it):
        the account's concurrency, within ``AIGCQ_EXTERNAL_CAPACITY_MAX``."""
        account = self.rt.config.account(aigc, platform)
        if account is None or self.adapter_for(platform) is None:
            return 0
        return capped(account.concurrency, self.rt.settings.external_capacity_max)

    async def take_over(
        self, aigc: str, platform: str, c: Claimed, source: str, reason: str
    ) -> int:
        """A task ``source`` handed back moves here in the same attempt: 1 moved (then
        :meth:`hand_over` it), 0 full (it waits), -1 it moved on, -2 no platform serves
        its queue (left as it is)."""
        adapter, cap = self.adapter_for(platform), self.cap(aigc, platform)
        if adapter is None or cap <= 0:
            return -2
        moved = await self.lifecycle.overflowed(c, source, adapter.name, cap=cap, reason=reason)
        if moved == 0:
            await self.lifecycle.not_sent(c, (aigc, platform), f"{adapter.name} full; {reason}")
        return moved

    async def hand_over(self, aigc: str, platform: str, tasks: list[Claimed]) -> list[HandBack]:
        adapter = self.adapter_for(platform)
        assert adapter is not None, "claimed for a platform no adapter serves"
        for c in tasks:
            await self._create(adapter, aigc, platform, c)
        return []

    def task_ended(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        """Nothing is held here: an unwanted remote task is the lifecycle's orphan."""

    async def _create(self, adapter: PlatformAdapter, aigc: str, platform: str, c: Claimed) -> None:
        lifecycle, name = self.lifecycle, adapter.name
        create_id = uuid.uuid4().hex

        async def begin() -> bool:  # the create may be out from here on
            return await lifecycle.creating(c, create_id)

        task = c.as_task(aigc, platform, name)
        hook = self.rt.webhook_url(c.task_id, c.attempt)
        apikey = self.rt.apikey(aigc, platform)
        outcome = await self.rt.platforms.submit(adapter, task, apikey, hook, begin=begin)
        queue, kind = (aigc, platform), adapter.kind
        match outcome:
            case Accepted(remote_id=remote_id):
                paid = adapter.paid
                await lifecycle.accepted(
                    c, remote_id, queue=queue, target=name, kind=kind, paid=paid
                )
                return
            case Uncertain(reason=reason):
                await lifecycle.uncertain(c, queue, kind, reason)
                return
            case Full(reason=reason):
                moved = await lifecycle.not_sent(c, queue, f"{name} full: {reason}")
            case NotSent(reason=reason):
                moved = await lifecycle.not_sent(c, queue, f"not sent to {name}: {reason}")
            case Rejected(retryable=True) as rej:
                reason = f"{name}: {rej.code} {rej.message}"
                moved = await lifecycle.refused(c, queue, reason, detail=rej.detail)
            case Rejected() as rej:
                error = {"code": rej.code, "message": rej.message, "detail": rej.detail}
                moved = await lifecycle.rejected(c, name, error)
        if not moved:  # it moved on while the create was out: free what that kept
            await lifecycle.never_created(c, create_id)
