"""Paid tasks whose webhook does not come: asked about after a silence, not at the deadline.

A callback platform (RunningHub) sends its result by webhook; one that is lost (a restart
of ours, a network fault) would leave the task running, holding its account's slot and its
client, until the task's deadline (600 s by default). Once a paid callback task has run for
``AIGCQ_PAID_SILENCE_S`` its platform is asked, and then again at that interval: a result
settles it as its webhook would have; anything else leaves it to its webhook and its
deadline (:mod:`.sweeper`, which decides what "not found" or "still running" means then).
Each silent task is asked about by one process per silence, whichever claims it first (a
key with the silence as its TTL), so a fleet asks no more often than one process would;
settling is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aigcq.domain import TaskState
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Failed, PlatformAdapter, Succeeded
from aigcq.plumbing.background import every
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle

log = logging.getLogger(__name__)

#: silent tasks asked about per queue and round
PAGE = 100


@dataclass(eq=False)
class SilentTasks:
    """Paid callback tasks whose webhook is overdue, asked about in its stead."""

    lifecycle: Lifecycle

    @property
    def rt(self) -> Runtime:
        return self.lifecycle.rt

    async def run(self) -> None:
        interval = min(self.rt.settings.paid_silence_s, 5.0)
        await every(interval, self.ask_once, log, "asking about silent paid tasks")

    async def ask_once(self) -> int:
        """Ask the platforms about every paid task silent for too long; how many settled."""
        settled = 0
        for aigc, platform in self.rt.config.queues():
            adapter = self.rt.platforms.adapter_for(platform)
            if adapter is not None and adapter.paid and adapter.kind == "callback":
                settled += await self._ask_queue(aigc, platform, adapter)
        return settled  # (polling platforms are asked by their poller anyway)

    async def _ask_queue(self, aigc: str, platform: str, adapter: PlatformAdapter) -> int:
        """Tasks of one queue running since before the silence (their deadline, the running
        set's score, is earlier than now plus what is left of a task's deadline then), a
        page at a time; each asked by the one process that claims it for this silence."""
        silence_s = self.rt.settings.paid_silence_s
        deadline_s = self.rt.deadline_s(self.rt.config.account(aigc, platform))
        key = self.rt.store.keys.running(aigc, adapter.name)
        cutoff = time.time() + deadline_s - silence_s
        settled, start = 0, 0
        while page := await self.rt.redis.zrangebyscore(key, "-inf", cutoff, start, PAGE):
            mine = await self._claim([str(t) for t in page], silence_s)
            why = f"no webhook after {silence_s:.0f} s"
            settled += sum(await asyncio.gather(*(self.ask(t, adapter, why) for t in mine)))
            if len(page) < PAGE:
                break
            start += PAGE
        return settled

    async def _claim(self, task_ids: list[str], silence_s: float) -> list[str]:
        """The tasks no process has asked about within the silence, now this one's."""
        pipe = self.rt.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.set(
                self.rt.store.keys.silence_asked(task_id), "1", nx=True, px=int(silence_s * 1000)
            )
        claimed = await pipe.execute()
        return [t for t, ok in zip(task_ids, claimed, strict=True) if ok]

    async def ask(self, task_id: str, adapter: PlatformAdapter, why: str) -> int:
        """Ask ``adapter`` about a running paid task (``why``: for the log); a result or
        failure it reports settles the task as its webhook would have. 1: it settled."""
        task = await self.rt.store.reads.get(task_id)
        if task is None or task.state is not TaskState.RUNNING or not task.remote_id:
            return 0
        apikey = self.rt.apikey(task.aigc, task.platform)
        outcome = await self.rt.platforms.query(adapter, task, apikey)
        if not isinstance(outcome, Succeeded | Failed):
            return 0
        log.warning(
            "task %s: %s; %s answers %s",
            task_id,
            why,
            adapter.name,
            type(outcome).__name__,
            extra=ctx(task=task_id),
        )
        note = f"asked {adapter.name}: {why}"
        done = await self.lifecycle.settle(
            task_id, outcome, note, attempt=task.attempt, target=task.target
        )
        return int(bool(done and done.applied))
