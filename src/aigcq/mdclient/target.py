"""``aigcq serve`` in the split topology: the message-dispatcher as its internal target.

Capacity comes from the dispatcher's capacity feed (:mod:`aigcq.mdclient.feed`)
and, while the feed is down, from polling ``GET /api/health`` every
``MESSAGE_DISPATCHER_HEALTH_CHECK_INTERVAL`` ms; the polling also judges health. A failed
check, a submit that timed out
or failed degrade it (no capacity: tasks overflow to RunningHub); it recovers after
``AIGCQ_HEALTH_RECOVER_PASSES`` (3) passing checks (seed 000 §3.4, §8.3). A task the
dispatcher did not take goes back to the head of its queue, its attempt not charged; one refused for
its token (401) also makes the JWT manager log in again at once.

``config/messageDispatcher.json`` (:mod:`aigcq.mdclient.file_config`): health checks
degrade after ``failureThreshold`` failures in a row (a failed or timed-out submit still
degrades at once); a submit the dispatcher failed is sent again up to ``retryCount`` times
before the task goes back to be routed (to RunningHub, since it degraded); ``priority``
false makes the dispatcher second to RunningHub (:attr:`MessageDispatcherTarget.preferred`).

Degrade notices (seed 000 §9.4.1): when the dispatcher loses instances it hands back the
pending tasks beyond what is left with ``TASK_DEGRADE`` on the capacity feed;
:meth:`MessageDispatcherTarget.take_back` puts each back in its queue — only while it is
still running on the dispatcher under the named remote id — so it is routed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from aigcq.config import Settings
from aigcq.domain import ErrorCode
from aigcq.health import Health
from aigcq.mdclient.feed import CapacityFeedClient
from aigcq.mdclient.file_config import apply_md_file, load_md_file
from aigcq.mdclient.settings import MdClientSettings
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Accepted, Full, NotSent, Rejected, SubmitOutcome, Uncertain
from aigcq.platforms.client import PlatformClient
from aigcq.platforms.md_auth import JwtManager
from aigcq.platforms.message_dispatcher import TOKEN_REFUSED, MessageDispatcherAdapter
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.ends import TaskEnd
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.targets import Chosen, HandBack, InternalTarget, InternalTargetBuilder

log = logging.getLogger(__name__)

#: pause before the n-th resend of a failed submit: n × this
RETRY_DELAY_S = 0.1


class MessageDispatcherTarget:
    name = MessageDispatcherAdapter.name
    serves: tuple[str, ...] = ("comfyui",)

    def __init__(self, rt: Runtime, lifecycle: Lifecycle, md: MdClientSettings) -> None:
        self.rt = rt
        self.lifecycle = lifecycle
        self.md = md
        every_ms = md.jwt_refresh_interval_ms
        self.jwt = JwtManager(
            md.url,
            md.username,
            md.password,
            refresh_ahead_s=md.jwt_refresh_ahead_s,
            refresh_every_s=every_ms / 1000 if every_ms else None,
        )
        self.adapter = MessageDispatcherAdapter(md.url)
        self.adapter.token = self.jwt.current
        # The sweeper and client cancels find it here: their queries carry the JWT too.
        rt.platforms.adapters[self.name] = self.adapter
        self.http = PlatformClient({self.name: self.adapter}, timeout_s=md.timeout_ms / 1000)
        self.health = Health(
            recover_passes=rt.settings.health_recover_passes,
            failure_threshold=md.health_check_failure_threshold,
        )
        self.feed = CapacityFeedClient(
            md.url,
            self.jwt.current,
            self._on_feed,
            on_degrade=self.take_back,
            on_lost=self._feed_lost,
        )
        self._free = 0
        self._check_now = asyncio.Event()
        #: ``priority`` (seed §3.7): false = RunningHub first, the dispatcher second
        self.preferred = md.priority

    # ---- InternalTarget ----------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self.health.healthy and self.jwt.current() is not None

    @property
    def health_view(self) -> Health:
        return self.health

    def free_slots(self) -> int:
        """Free slots last reported, minus those used since; none while degraded."""
        return self._free if self.healthy else 0

    def free_elsewhere(self) -> int:
        return 0  # every serve process sees the dispatcher's whole capacity

    async def fresh_elsewhere(self) -> int:
        return 0

    async def choose(
        self,
        aigc: str,
        platform: str,
        n: int,
        *,
        paid_free: int | None,
        among: Sequence[str] | None = None,
    ) -> Chosen | None:
        return None  # the dispatcher places what it takes: any task, from the head

    async def hand_over(self, aigc: str, platform: str, tasks: list[Claimed]) -> list[HandBack]:
        accepted = await asyncio.gather(*(self._submit(aigc, platform, c) for c in tasks))
        await self.feed.allocate([remote_id for remote_id in accepted if remote_id])
        return []  # what it did not take waits again: routed anew

    def task_ended(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        """Nothing is held here: the dispatcher frees its own slots (a cancel reaches it
        through its adapter's cancel, see :meth:`Lifecycle.cancelled`)."""

    # ---- background ---------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the token fresh and the capacity known, until cancelled."""
        try:
            await asyncio.gather(self.jwt.run(), self._watch(), self.feed.run())
        finally:
            await self.http.aclose()

    async def _watch(self) -> None:
        """Check every ``health_check_interval_ms``, and at once when the feed drops."""
        async with httpx.AsyncClient(timeout=self.md.health_check_timeout_ms / 1000) as http:
            while True:
                self._check_now.clear()
                await self.check(http)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._check_now.wait(), self.md.health_check_interval_ms / 1000
                    )

    async def _feed_lost(self) -> None:
        """The capacity feed dropped (seed §8.3.1: connection lost): its free slots are
        stale, so check now; a dispatcher that is gone fails the check at once."""
        self._free = 0
        self._check_now.set()

    async def check(self, http: httpx.AsyncClient) -> None:
        """One health check: updates the health state, and free slots while the feed is down."""
        try:
            resp = await http.get(self.md.url.rstrip("/") + "/api/health")
            data: Any = resp.json().get("data")
            healthy, free = bool(data["healthy"]), int(data["freeSlots"])
            reason = "" if healthy else f"dispatcher reports {data.get('status', 'unhealthy')}"
        except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError) as exc:
            free, reason = 0, f"health check failed: {exc!r}"
        before = self.free_slots()
        if not self.feed.connected:
            self._free = free
        self._observe(reason)
        await self._wake_if_more(before)

    async def _on_feed(self, summary: dict[str, Any]) -> None:
        """A CAPACITY_UPDATE: its ``availableCapacity`` replaces the free slots at once."""
        before = self.free_slots()
        free = summary.get("availableCapacity")
        self._free = free if isinstance(free, int) else 0
        await self._wake_if_more(before)

    async def _wake_if_more(self, before: int) -> None:
        if self.free_slots() > before:
            await self.rt.redis.publish(self.rt.store.keys.events, "wake")

    def _observe(self, reason: str, *, immediate: bool = False) -> None:
        changed = self.health.observe(reason, immediate=immediate)
        if changed is not None:
            level = logging.INFO if self.health.healthy else logging.WARNING
            log.log(level, "message-dispatcher %s%s", changed, f": {reason}" if reason else "")

    # ---- submitting ---------------------------------------------------------------------

    async def _submit(self, aigc: str, platform: str, c: Claimed) -> str | None:
        """Submit one task; the dispatcher's task id when it accepted it."""
        token = self.jwt.current()
        if token is None:
            await self.lifecycle.not_run(c.task_id, c.attempt, "no message-dispatcher token")
            return None
        self._free = max(0, self._free - 1)
        task = c.as_task(aigc, platform, self.name)
        hook = self.rt.webhook_url(c.task_id, c.attempt)
        trace = self.lifecycle.traces.attempt(c)  # the dispatcher's task goes on in it
        outcome = await self.http.submit(self.adapter, task, token, hook, traceparent=trace)
        for retry in range(1, self.md.retry_count + 1):
            if not _failed(outcome):
                break
            problem = _problem(outcome)
            self._observe(f"submit failed: {problem}", immediate=True)
            log.info(
                "task %s: message-dispatcher submit failed (%s), retry %d/%d",
                c.task_id,
                problem,
                retry,
                self.md.retry_count,
            )
            await asyncio.sleep(RETRY_DELAY_S * retry)
            outcome = await self.http.submit(self.adapter, task, token, hook, traceparent=trace)
        return await self._apply(aigc, platform, c, outcome)

    async def _apply(
        self, aigc: str, platform: str, c: Claimed, outcome: SubmitOutcome
    ) -> str | None:
        lifecycle, queue = self.lifecycle, (aigc, platform)
        match outcome:
            case Accepted(remote_id=remote_id):
                await lifecycle.accepted(
                    c, remote_id, queue=queue, target=self.name, kind="callback"
                )
                log.info(
                    "task %s: accepted by the message-dispatcher as %s",
                    c.task_id,
                    remote_id,
                    extra=ctx(task=c.task_id),
                )
                return remote_id
            case Uncertain(reason=reason):  # it may have been queued
                await lifecycle.uncertain(c, queue, "callback", reason)
                self._observe(f"submit uncertain: {reason}", immediate=True)
            case Full(reason=reason):
                self._free = 0
                await lifecycle.not_run(c.task_id, c.attempt, f"message-dispatcher full: {reason}")
            case Rejected(code=code) as rej if code == TOKEN_REFUSED:
                self.jwt.renew_now()
                reason = f"message-dispatcher refused the token: {rej.message}"
                await lifecycle.not_run(c.task_id, c.attempt, reason)
            case Rejected(retryable=True) | NotSent():
                self._observe(f"submit failed: {_problem(outcome)}", immediate=True)
                reason = f"message-dispatcher: {_problem(outcome)}"
                await lifecycle.not_run(c.task_id, c.attempt, reason)
            case Rejected() as rej:
                reason = f"message-dispatcher rejected: {rej.code} {rej.message}"
                await lifecycle.refused(c, queue, reason, code=ErrorCode.TASK_TIMEOUT)
        return None

    # ---- degrade notices (seed 000 §9.4.1) ---------------------------------------------

    async def take_back(self, remote_ids: list[str]) -> list[str]:
        """Requeue the tasks the dispatcher handed back; the remote ids taken back.

        A task is taken back only while it is running on the dispatcher under that remote
        id (checked atomically with the requeue): one that finished, was retried or moved
        on meanwhile is left as it is. The attempt is charged, and a late TASK_END for
        the handed-back run is refused as superseded."""
        taken = []
        for remote_id in remote_ids:
            task_id = await self.rt.store.reads.task_for_remote(remote_id)
            task = await self.rt.store.reads.head(task_id) if task_id else None
            if task is None or task.target != self.name or task.remote_id != remote_id:
                log.info("degrade notice for %s: not ours or moved on, ignored", remote_id)
                continue
            reason = f"handed back by the message-dispatcher ({remote_id})"
            if await self.lifecycle.taken_back(task, remote_id, reason):
                taken.append(remote_id)
        return taken


def _failed(outcome: SubmitOutcome) -> bool:
    """A submit the dispatcher certainly did not take, worth sending again (``retryCount``):
    never sent (unreachable) or a transient error. A timeout is not: it may have been queued."""
    if isinstance(outcome, NotSent):
        return True
    return isinstance(outcome, Rejected) and outcome.retryable and outcome.code != TOKEN_REFUSED


def _problem(outcome: SubmitOutcome) -> str:
    if isinstance(outcome, Rejected):
        return f"{outcome.code} {outcome.message}"
    return f"not sent: {getattr(outcome, 'reason', outcome)}"


def internal_target(settings: Settings) -> InternalTargetBuilder | None:
    """The message-dispatcher target when ``MESSAGE_DISPATCHER_URL`` is set and enabled;
    ``config/messageDispatcher.json`` fills in what the environment does not set."""
    md = MdClientSettings()
    md.url = settings.message_dispatcher_url or md.url
    file = load_md_file(settings.config_dir)
    if file is not None:
        apply_md_file(file, md, settings)
    if not md.active:
        return None
    if not md.password:
        log.error(
            "MESSAGE_DISPATCHER_URL is %s but MD_PASSWORD is unset: this process cannot log in "
            "to the message-dispatcher, so it has no internal capacity and every task goes to "
            "its paid platform (or waits); set MD_PASSWORD (AIGCQ_MD_PASSWORD) to the "
            "dispatcher's",
            md.url,
        )

    def build(rt: Runtime, lifecycle: Lifecycle) -> InternalTarget:
        log.info("internal target: message-dispatcher at %s", md.url)
        return MessageDispatcherTarget(rt, lifecycle, md)

    return build
