"""Handing tasks to bridges: TASK_ASSIGN, what its TASK_ACK says, what a refusal means.

A slot is taken when TASK_ASSIGN is sent. When bridges describe their instances, each task
is counted on a free instance that can run it (:mod:`.placing`), named in TASK_ASSIGN, and
only such tasks are claimed (:mod:`.lookahead`). TASK_ACK code 0 marks the task RUNNING; a
refusal, a missing ACK or a lost bridge puts an unacknowledged task back at the head of its
queue, uncharged; a workflow nobody knows fails the task at once (``WorkflowNotFound``), as
does an invalid payload; a task no connected instance can run goes to the external platform
(``NoCapableInstance`` when none serves its queue; after ``AIGCQ_NO_CAPABLE_WAIT_S`` when
an offline instance could; ``UnknownNodeClass``, the client's mistake, when a node class of
it is offered by no bridge of the cluster), or waits for a bridge that left within its
grace and could; an acknowledged task that is no longer wanted is stopped on its bridge.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from aigcq.bridges.endings import TaskEnds
from aigcq.bridges.lookahead import (
    ELSEWHERE_WAIT_S,
    LEFT_RECHECK_S,
    Candidate,
    Reach,
    Rules,
    Window,
    choose,
)
from aigcq.bridges.placing import Matching, Slot
from aigcq.bridges.registry import Assignment, BridgeConn, BridgeRegistry
from aigcq.bridges.session import HubConfig, Session
from aigcq.domain import ErrorCode
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import Spawner
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.targets import Chosen, HandBack, Unrunnable
from aigcq.wire.bridge import (
    ACK_OK,
    ACK_WORKFLOW_NOT_FOUND,
    TaskAckData,
    TaskAssignData,
    TaskAssignMessage,
    encode,
)
from aigcq.wire.capabilities import Needs, needs_of, with_overrides

log = logging.getLogger(__name__)

#: how long a task that only busy instances can run waits before it is claimed again
BUSY_WAIT_S = 0.5
#: how many tasks' first time with only offline instances able to run them are kept
OFFLINE_KEPT = 4096


@dataclass(eq=False)
class Assigner:
    rt: Runtime
    lifecycle: Lifecycle
    registry: BridgeRegistry
    ends: TaskEnds
    _: KW_ONLY
    name: str
    config: Callable[[], HubConfig]
    wake: Callable[[], None]
    lost: Callable[[BridgeConn, str], Awaitable[None]]
    #: whether another process's bridge can run what none here can (:mod:`.peer_offers`)
    elsewhere: Callable[[Needs], Reach] = lambda needs: Reach.NOWHERE
    #: the node classes of ``needs`` no bridge of the cluster offers (:mod:`.peer_offers`)
    unknown: Callable[[Needs], frozenset[str]] = lambda needs: frozenset()
    needs: WorkflowNeeds = field(init=False)
    window: Window = field(init=False)
    _spawn: Spawner = field(init=False, default_factory=Spawner)
    #: taskId -> since when (monotonic) only offline instances could run it
    _offline_since: OrderedDict[str, float] = field(init=False, default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.needs = WorkflowNeeds(self.rt)
        self.window = Window(self.rt, self.needs.of)

    async def choose(
        self,
        aigc: str,
        platform: str,
        n: int,
        *,
        paid_free: int | None,
        among: Sequence[str] | None = None,
    ) -> Chosen | None:
        """Which of the queue's first ``n`` + ``AIGCQ_BRIDGE_LOOKAHEAD`` waiting tasks to
        claim (see :mod:`.lookahead`), or of ``among``; ``None`` when no bridge here
        describes its instances (any task runs on any free slot: the head)."""
        if not self.registry.describing():
            return None
        settings = self.rt.settings
        size = max(n, 0) + settings.bridge_lookahead
        window = await self.window.read(aigc, platform, size, among)
        now, candidates = time.time(), []
        for task_id, needs, created in window:
            reach, offline_s = self._reach(task_id, needs)
            candidates.append(Candidate(task_id, needs, reach, now - created, offline_s))
        rules = Rules(
            n,
            paid_free,
            settings.overflow_after_ms / 1000,
            settings.no_capable_wait_s,
        )
        chosen = choose(candidates, self.registry.free_spots(len(candidates)), rules)
        for task_id in chosen.ids:
            self.window.forget(task_id)
        return chosen

    def _reach(self, task_id: str, needs: Needs | None) -> tuple[Reach, float]:
        """Where the instances that can run ``needs`` are, and (only offline ones) for how
        long that has been so."""
        if needs is None or self.registry.anyone_can_run(needs):
            reach = Reach.BUSY
        elif self.registry.anyone_could_run(needs):
            reach = Reach.OFFLINE
        else:
            reach = self.elsewhere(needs)
        if reach is not Reach.OFFLINE:
            self._offline_since.pop(task_id, None)
            return reach, 0.0
        since = self._offline_since.setdefault(task_id, time.monotonic())
        while len(self._offline_since) > OFFLINE_KEPT:
            self._offline_since.popitem(last=False)
        return reach, time.monotonic() - since

    async def assign(self, aigc: str, platform: str, tasks: list[Claimed]) -> list[HandBack]:
        """Each task to a free slot that can run it: counted on an instance (see
        :meth:`_spots`) when bridges describe theirs, else the least-loaded bridge with a
        free slot that can (see :meth:`BridgeRegistry.pick`); the ones no free slot here
        can run are handed back (see :meth:`_unplaced`)."""
        handed: list[HandBack] = []
        needs = [await self.needs.of(c.payload, c.workflow_id) for c in tasks]
        spots = self._spots(tasks, needs) if self.registry.describing() else None
        for i, c in enumerate(tasks):
            holding = self.registry.holders(c.task_id)  # an older attempt still there
            if spots is not None:
                spot = spots[i]
            else:
                conn = self.registry.pick(c.workflow_id, needs[i], exclude=holding)
                spot = Slot(conn, "", None) if conn is not None else None
            if spot is not None:
                await self.send_assign(spot.owner, aigc, platform, c, spot.instance_id, needs[i])
            elif holding and self.registry.free_slots() > 0:
                # only the bridge(s) still holding its older attempt have room: wait for
                # them to let it go (or another bridge to free up), not in a claim loop
                reason = f"bridge {holding[0].bridge_id} still holds an older attempt"
                await self.lifecycle.not_run(c.task_id, c.attempt, reason, delay_s=BUSY_WAIT_S)
            elif (back := await self._unplaced(aigc, platform, c, needs[i])) is not None:
                handed.append(back)
        return handed

    def _spots(self, tasks: list[Claimed], needs: list[Needs | None]) -> list[Slot | None]:
        """Each task's slot (:class:`~.placing.Matching` over the free ones, in order): not
        on a bridge still holding an older attempt of it; one whose models are loaded
        first."""
        matching = Matching(self.registry.free_spots(len(tasks)))
        for n in needs:
            matching.add(n)

        holding = [self.registry.holders(c.task_id) for c in tasks]
        models = [n.models if n is not None else frozenset() for n in needs]

        def allowed(task: int, slot: Slot) -> bool:
            return not holding[task] or slot.owner not in holding[task]

        def warm(task: int, slot: Slot) -> bool:
            return bool(models[task]) and slot.owner.warm.get(slot.instance_id) == models[task]

        return matching.spots(allowed, warm)

    async def _unplaced(
        self, aigc: str, platform: str, c: Claimed, needs: Needs | None
    ) -> HandBack | None:
        """No free slot here can run ``c``. Internal capacity for a task is the free slots on
        instances that can run it: none connected anywhere can, it goes to the external
        platform, or fails (``NoCapableInstance``) when none serves its queue; those that can
        are busy, it overflows as when every slot is busy (after ``overflow_after_ms``), or
        waits a moment for them; only offline ones could, it overflows as if busy, and once
        it has waited ``no_capable_wait_s`` for one to come back, at once or it fails; none
        here can but another process's bridge can (:mod:`.peer_offers`), it waits for that
        one, and once it has waited ``ELSEWHERE_WAIT_S`` it overflows; only a bridge that
        left within its grace can, it waits for that one; none in the cluster can, it
        overflows or fails at once."""
        if needs is None:  # not known: it waits for a free slot
            await self.lifecycle.not_run(c.task_id, c.attempt, "no bridge has a free slot")
            return None
        after_s = self.rt.settings.overflow_after_ms / 1000
        reach, offline_s = self._reach(c.task_id, needs)
        if reach is Reach.BUSY:
            return HandBack(c, "its capable instances are busy", after_s, BUSY_WAIT_S)
        if reach is Reach.OFFLINE:
            reason = f"only offline ComfyUI instances have {_listed(needs)}"
            left_s = self.rt.settings.no_capable_wait_s - offline_s
            if left_s > 0:
                return HandBack(c, reason, after_s, max(left_s, BUSY_WAIT_S))
            detail = f"{reason}, none came back within {self.rt.settings.no_capable_wait_s:g} s"
            return HandBack(c, reason, 0.0, unrunnable=self._nobody(aigc, platform, detail))
        if reach is Reach.ELSEWHERE:
            return HandBack(c, "no bridge here can run it", ELSEWHERE_WAIT_S, BUSY_WAIT_S)
        if reach is Reach.LEFT:
            reason = "only a bridge that left within its grace can run it"
            return HandBack(c, reason, math.inf, LEFT_RECHECK_S)
        reason = f"no ComfyUI instance of the cluster has {_listed(needs)}"
        unknown = self.unknown(needs)
        if unknown:
            return HandBack(c, reason, 0.0, unrunnable=self._mistaken(unknown))
        return HandBack(c, reason, 0.0, unrunnable=self._nobody(aigc, platform, reason))

    def _mistaken(self, unknown: frozenset[str]) -> Unrunnable:
        """``UnknownNodeClass``: node classes no bridge of the cluster offers are the
        client's mistake (class ``task``), not a want of capacity; they are named."""
        code = ErrorCode.UNKNOWN_NODE_CLASS.value
        classes = sorted(unknown)
        reason = "no bridge of the cluster offers node classes: " + ", ".join(classes)
        detail = {"class": "task", "nodeClasses": classes, "reason": reason}
        return Unrunnable(code, self.rt.config.messages.get(code), detail)

    def _nobody(self, aigc: str, platform: str, why: str) -> Unrunnable:
        """``NoCapableInstance``: the message code.json has for it, ``why`` and that no paid
        platform serves the queue in its detail."""
        message = self.rt.config.messages.get("NoCapableInstance")
        detail = f"{why}, and no external platform serves {aigc}/{platform}"
        return Unrunnable("NoCapableInstance", message, detail)

    async def on_ack(self, session: Session, conn: BridgeConn, data: TaskAckData) -> None:
        """A TASK_ACK: code 0 is :meth:`acked`, anything else :meth:`refused`; an ACK for no
        assignment awaiting one gets an ``UnknownTask`` error."""
        task_id = data.data.task_id
        if task_id not in conn.pending:
            if conn.slots.ended_early(task_id):  # finished already: nothing left to do
                return
            if not conn.pending or data.data.attempt is not None:
                await session.error("UnknownTask", f"task {task_id!r} is not awaiting an ACK")
                return
            # a seed-002 bridge (no attempt echoed) acknowledges with its own taskId: it
            # answers the oldest assignment it has not acknowledged
            remote_id, task_id = task_id, next(iter(conn.pending))
            conn.pending[task_id].remote_id = remote_id
        if data.code == ACK_OK:
            pending = conn.ack(task_id)
            assert pending is not None
            await self.acked(conn, task_id, pending)
        else:
            await self.refused(conn, task_id, data)

    async def refused(self, conn: BridgeConn, task_id: str, data: TaskAckData) -> None:
        """A refusal: nothing is withheld on a guess. Counts in the refusal are the bridge's
        current truth, applied at once; a refusal that says nothing about capacity (380)
        frees the slot at once; only a bare 421 (or an unknown code) from a bridge that
        sends no counts (a seed bridge) keeps the slot busy until its next report. The
        task waits again (after a back-off when this bridge still has a free slot, so it
        does not come straight back to be refused), or fails when nobody knows its
        workflow."""
        counted = data.has_counts
        withhold = not counted and data.code != ACK_WORKFLOW_NOT_FOUND
        pending = conn.refuse(task_id, withhold=withhold)
        assert pending is not None
        if counted:
            assert data.instance_count is not None and data.available_instance_count is not None
            conn.report(
                data.instance_count, data.available_instance_count, data.tasks, data.instances
            )
            await self.registry.save(conn)
        reason = f"bridge {conn.bridge_id} refused: {data.code} {data.msg}"
        if data.code == ACK_WORKFLOW_NOT_FOUND:
            if not await self.workflow_known(pending.workflow_id):
                await self.lifecycle.unrunnable(
                    task_id, "WorkflowNotFound", data.msg, pending.workflow_id
                )
                self.wake()
                return
            await self.lifecycle.retry_or_fail(  # a new attempt each time: bounded
                task_id,
                aigc=pending.aigc,
                platform=pending.platform,
                attempt=pending.attempt,
                charged=pending.charged,
                reason=reason,
                code=ErrorCode.TASK_FAILED,
                detail={"code": "WorkflowNotFound", "workflowId": pending.workflow_id},
            )
        else:
            delay = BUSY_WAIT_S if conn.free() > 0 else 0.0
            await self.lifecycle.not_run(task_id, pending.attempt, reason, delay_s=delay)
        self.wake()

    async def workflow_known(self, workflow_id: str) -> bool:
        """Whether the workflow registry holds ``workflow_id``."""
        if not workflow_id:
            return False
        return bool(await self.rt.redis.exists(self.rt.store.keys.workflow(workflow_id)))

    async def acked(self, conn: BridgeConn, task_id: str, pending: Assignment) -> None:
        queue, remote_id = (pending.aigc, pending.platform), pending.remote_id or task_id
        ok = await self.lifecycle.accepted(
            pending,
            remote_id,
            queue=queue,
            target=self.name,
            kind="callback",
            holder=conn.bridge_id,
        )
        # no longer wanted (cancelled, superseded): stop it on the bridge
        if not ok and conn.end(task_id, pending.attempt, stopping=True):
            self._spawn(self.ends.cancel_on(conn, task_id, pending.attempt))
            self.wake()
        log.info(
            "bridge %s: task %s acknowledged (running=%s)",
            conn.bridge_id,
            task_id,
            ok,
            extra=ctx(task=task_id, bridge=conn.bridge_id),
        )

    async def send_assign(
        self,
        conn: BridgeConn,
        aigc: str,
        platform: str,
        c: Claimed,
        instance_id: str = "",
        needs: Needs | None = None,
    ) -> None:
        """TASK_ASSIGN ``c`` to ``conn``, counted on ``instance_id`` ("": on none)."""
        self._offline_since.pop(c.task_id, None)
        try:
            msg = self._assign_message(c, instance_id)
        except ValidationError as exc:
            await self.lifecycle.unrunnable(
                c.task_id, "InvalidPayload", "not a valid bridge task", str(exc)
            )
            return
        pending = Assignment(
            c.attempt,
            aigc,
            platform,
            c.backend_id,
            workflow_id=c.workflow_id,
            charged=c.charged,
            task_id=c.task_id,
        )
        models = needs.models if needs is not None else frozenset()
        if not conn.take(c.task_id, pending, instance_id, models):  # full, or it holds it
            reason = f"bridge {conn.bridge_id} is full"
            await self.lifecycle.not_run(c.task_id, c.attempt, reason, delay_s=BUSY_WAIT_S)
            return
        pending.timer = asyncio.get_running_loop().call_later(
            self.config().ack_timeout_s, self._spawn_ack_timeout, conn, c.task_id
        )
        try:
            await conn.send(encode(msg))
        except Exception as exc:  # the socket went away mid-send
            log.warning(
                "bridge %s: task %s send failed: %r",
                conn.bridge_id,
                c.task_id,
                exc,
                extra=ctx(task=c.task_id, bridge=conn.bridge_id),
            )
            await self.lost(conn, "send failed")
            return
        log.info(
            "bridge %s: task %s assigned (attempt %d)",
            conn.bridge_id,
            c.task_id,
            c.attempt,
            extra=ctx(task=c.task_id, bridge=conn.bridge_id),
        )

    def _assign_message(self, c: Claimed, instance_id: str) -> TaskAssignMessage:
        hook = self.rt.webhook_url(c.task_id, c.attempt)
        data = TaskAssignData.model_validate(
            {
                "taskId": c.task_id,
                "attempt": c.attempt,
                "instanceId": instance_id or None,
                "workflowId": c.workflow_id or None,
                "nodeInfoList": c.payload.get("nodeInfoList") or [],
                "webhookUrl": hook,
                "workflow": c.payload.get("workflow"),
                "traceparent": self.lifecycle.traces.attempt(c) or None,
            }
        )
        return TaskAssignMessage(data=data)

    def _spawn_ack_timeout(self, conn: BridgeConn, task_id: str) -> None:
        self._spawn(self._ack_timeout(conn, task_id))

    async def _ack_timeout(self, conn: BridgeConn, task_id: str) -> None:
        pending = conn.release(task_id)
        if pending is not None:
            log.warning(
                "bridge %s: task %s not acknowledged in time",
                conn.bridge_id,
                task_id,
                extra=ctx(task=task_id, bridge=conn.bridge_id),
            )
            reason = f"bridge {conn.bridge_id}: no TASK_ACK"
            await self.lifecycle.not_run(task_id, pending.attempt, reason)
            self.wake()

    async def hand_back(self, reason: str = "aigcq shutting down") -> list[str]:
        """Graceful shutdown: every task assigned here and not yet acknowledged goes back to
        the head of its queue, uncharged (a bridge's late TASK_ACK is then ignored)."""
        handed: list[str] = []
        for conn in list(self.registry.bridges.values()):
            for task_id, p in conn.release_all().items():
                await self.lifecycle.not_run(
                    task_id, p.attempt, f"bridge {conn.bridge_id}: {reason}"
                )
                handed.append(task_id)
        return handed


def _listed(needs: Needs) -> str:
    return Needs().missing(needs)


class WorkflowNeeds:
    """The node classes and model files a claimed task's workflow names: its inline
    ``workflow``, else its ``workflowId`` from the registry (cached a minute; one read per
    workflow id), with its ``nodeInfoList``'s model files. ``None``: not known."""

    TTL_S = 60.0
    KEPT = 1024

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._cache: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def of(self, payload: dict[str, Any], workflow_id: str) -> Needs | None:
        """What a task with ``payload`` (naming ``workflow_id``) needs."""
        workflow = _graph(payload.get("workflow"))
        if workflow is None and workflow_id:
            workflow = await self._registered(workflow_id)
        if workflow is None:
            return None
        return with_overrides(needs_of(workflow), workflow, payload.get("nodeInfoList"))

    async def _registered(self, workflow_id: str) -> dict[str, Any] | None:
        now = time.monotonic()
        cached = self._cache.get(workflow_id)
        if cached is not None and now - cached[0] < self.TTL_S:
            return cached[1]
        raw = await self.rt.redis.get(self.rt.store.keys.workflow(workflow_id))
        graph = _graph(raw)
        if len(self._cache) >= self.KEPT:
            self._cache.clear()
        self._cache[workflow_id] = (now, graph)
        return graph


def _graph(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, str | bytes):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
    return raw if isinstance(raw, dict) else None
