"""The bridge hub: bridges connect to ``/ws``, we assign them tasks (an ``InternalTarget``).

A slot is taken when TASK_ASSIGN is sent and reconciled with each HEARTBEAT. TASK_ACK code 0
marks the task RUNNING (its TASK_END arrives over HTTP); a refusal, a missing ACK or a lost
bridge puts an unacknowledged task back at the head of its queue, uncharged. Bad input gets
an ``ERROR`` frame and changes nothing; a bad token closes with 4401, a flood with 4008.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from aigcq.bridges.peers import PeerCapacity
from aigcq.bridges.progress import ProgressRelay
from aigcq.bridges.protocol import (
    ACK_OK,
    BridgeMessage,
    ErrorData,
    ErrorMessage,
    HeartbeatData,
    HeartbeatMessage,
    PingMessage,
    PongMessage,
    ProtocolError,
    RegisterData,
    RegisterMessage,
    TaskAckData,
    TaskAckMessage,
    TaskAssignData,
    TaskAssignMessage,
    TaskProgressMessage,
    encode,
    parse_bridge_message,
)
from aigcq.bridges.registry import Assignment, BridgeConn, BridgeRegistry
from aigcq.domain import ErrorCode, TaskState
from aigcq.gateway.auth import Auth, bearer
from aigcq.health import Health, HealthMonitor
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import REDIS_OUTAGE
from aigcq.plumbing.events import bridge_end_event, progress_event, running_message
from aigcq.plumbing.ws_frames import receive_frame
from aigcq.queue.store import Claimed
from aigcq.scheduler.outcomes import Outcomes
from aigcq.service.runtime import Runtime

log = logging.getLogger(__name__)

CLOSE_AUTH = 4401
CLOSE_FLOOD = 4008
CLOSE_TIMEOUT = 4000


@dataclass(frozen=True, slots=True)
class HubConfig:
    ping_interval_s: float = 30.0
    heartbeat_interval_s: float = 30.0
    missed_heartbeats: int = 3
    ack_timeout_s: float = 5.0


class _Rate:
    """At most ``limit`` messages per one-second window (``0``: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.window = 0
        self.count = 0

    def allow(self) -> bool:
        now = int(time.monotonic())
        if now != self.window:
            self.window, self.count = now, 0
        self.count += 1
        return self.limit <= 0 or self.count <= self.limit


@dataclass(slots=True)
class _Session:
    """One WebSocket: authenticated yet?, the bridge registered on it, its PING loop."""

    ws: WebSocket
    authed: bool
    rate: _Rate
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: BridgeConn | None = None
    keepalive: asyncio.Task[None] | None = None

    async def send(self, text: str) -> None:
        async with self.lock:
            await self.ws.send_text(text)


class BridgeHub:
    """Bridges connected to this process, as the dispatcher's internal target."""

    name = "bridge"
    serves: tuple[str, ...] = ("comfyui",)
    preferred = True

    def __init__(
        self,
        rt: Runtime,
        outcomes: Outcomes,
        *,
        wake: Callable[[], None] = lambda: None,
        config: HubConfig | None = None,
    ) -> None:
        self.rt = rt
        self.outcomes = outcomes
        self.wake = wake
        self.config = config or HubConfig()
        self.auth = Auth(rt.settings)
        ttl = int(self.config.heartbeat_interval_s * self.config.missed_heartbeats * 4)
        self.registry = BridgeRegistry(rt.store, rt.settings.project_prefix, ttl_s=ttl)
        self.health = HealthMonitor(
            rt.redis, self.registry.live, rt.settings, on_change=lambda: self.wake()
        )
        self.progress = ProgressRelay(rt)
        self.peers = PeerCapacity(
            rt.redis,
            rt.store.keys.internal_free,
            lambda: (self.free_slots(), len(self.registry.live())),
            on_less=lambda: self.wake(),
        )
        # md:state:* describes the fleet: a process with no bridge leaves it to one with some
        self.health.speaks = lambda: bool(self.registry.live()) or not self.peers.bridges_elsewhere
        self._background: set[asyncio.Task[None]] = set()

    # ---- InternalTarget ----------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    @property
    def health_view(self) -> Health:
        return self.health.health

    def free_slots(self) -> int:
        """Free slots on bridges in rotation; none while health is not ``healthy``."""
        return self.registry.free_slots() if self.health.healthy else 0

    def free_elsewhere(self) -> int:
        """Free slots on bridges connected to other processes (see :mod:`.peers`)."""
        return self.peers.elsewhere

    async def assign(self, aigc: str, platform: str, tasks: list[Claimed]) -> None:
        """Each task to the least-loaded bridge with a free slot (see
        :meth:`BridgeRegistry.pick`), else back to waiting."""
        for c in tasks:
            conn = self.registry.pick(c.workflow_id)
            if conn is None:
                await self._requeue(c.task_id, c.attempt, "no bridge has a free slot")
                continue
            await self._send_assign(conn, aigc, platform, c)

    async def drain(self, bridge_id: str, drained: bool) -> bool:
        """Stop (or resume) assigning to ``bridge_id``; ``False`` if it is not connected here
        (then it takes effect when it connects)."""
        conn = self.registry.set_drained(bridge_id, drained)
        log.warning(
            "bridge %s: %s",
            bridge_id,
            "drained" if drained else "undrained",
            extra=ctx(bridge=bridge_id),
        )
        if conn is None:
            return False
        await self._save(conn)
        if not drained:
            self.wake()
        return True

    # ---- the WebSocket endpoint ---------------------------------------------------------

    async def endpoint(self, ws: WebSocket) -> None:
        """``/ws``: token in ``?token=``, ``Authorization: Bearer`` or REGISTER ``data.token``."""
        await ws.accept()
        token = ws.query_params.get("token") or bearer(ws.headers.get("authorization"))
        limit = self.rt.settings.bridge_max_msgs_per_s
        session = _Session(ws, authed=token is not None, rate=_Rate(limit))
        if token is not None and not self.auth.bridge(token):
            await self._refuse(session)
            return
        try:
            while (raw := await receive_frame(ws)) is not None:
                if not session.rate.allow():
                    log.warning(
                        "bridge %s: message flood, closing", _bid(session), extra=_ctx(session)
                    )
                    await ws.close(CLOSE_FLOOD, "too many messages")
                    break
                if not await self._on_frame_or_outage(session, raw):
                    break
        except WebSocketDisconnect:
            pass
        finally:
            if session.keepalive is not None:
                session.keepalive.cancel()
            if session.conn is not None:
                await self._lost(session.conn, "socket closed")

    async def _on_frame_or_outage(self, session: _Session, raw: str | bytes) -> bool:
        """:meth:`_on_frame`, keeping the bridge connected through a Redis outage: the
        message's effect is lost (what it reported comes again: heartbeats, held tasks on
        REGISTER, TASK_END retried by the bridge), not the connection."""
        try:
            return await self._on_frame(session, raw)
        except REDIS_OUTAGE as exc:
            log.warning(
                "bridge %s: message not handled, Redis unavailable (%s)",
                _bid(session),
                exc,
                extra=_ctx(session),
            )
            return True

    async def _on_frame(self, session: _Session, raw: str | bytes) -> bool:
        """Handle one frame; ``False`` when the connection was closed."""
        try:
            msg = parse_bridge_message(raw, sender="bridge")
        except ProtocolError as exc:
            if not session.authed:
                await self._refuse(session)
                return False
            log.info("bridge %s: bad message: %s", _bid(session), exc, extra=_ctx(session))
            await session.send(encode(exc.to_message()))
            return True
        if not session.authed:
            if not (isinstance(msg, RegisterMessage) and self.auth.bridge(msg.data.token)):
                await self._refuse(session)
                return False
            session.authed = True
        await self._on_message(session, msg)
        return True

    async def _on_message(self, session: _Session, msg: BridgeMessage) -> None:
        conn = session.conn
        if isinstance(msg, RegisterMessage):
            await self._register(session, msg.data)
        elif conn is None:
            await _error(session, "NotRegistered", f"{msg.type} before REGISTER")
        elif isinstance(msg, HeartbeatMessage):
            await self._heartbeat(conn, msg.data)
        elif isinstance(msg, TaskAckMessage):
            await self._ack(session, conn, msg.data)
        elif isinstance(msg, PongMessage):
            conn.last_pong = time.monotonic()
        elif isinstance(msg, TaskProgressMessage):
            await self.progress.forward(msg.data)

    async def _refuse(self, session: _Session) -> None:
        log.warning("bridge connection refused: invalid or missing token")
        await _error(session, "AuthError", "invalid or missing bridge token")
        await session.ws.close(CLOSE_AUTH, "AuthError")

    # ---- bridge messages ----------------------------------------------------------------

    async def _register(self, session: _Session, data: RegisterData) -> None:
        bridge_id = data.bridge_id
        if session.conn is not None and session.conn.bridge_id != bridge_id:
            await _error(session, "InvalidMessage", "bridgeId cannot change on a connection")
            return
        old = self.registry.bridges.get(bridge_id)
        if old is not None and old is not session.conn:
            await self._lost(old, "replaced by a new connection", check=False)
        conn = session.conn or BridgeConn(bridge_id, session.send)
        conn.online = True
        conn.drained = bridge_id in self.registry.drained
        conn.reconcile(data.instance_count, data.available_instance_count)
        self.registry.bridges[bridge_id] = conn
        session.conn = conn
        if session.keepalive is None:
            session.keepalive = asyncio.create_task(self._keepalive(session, conn))
        await self._save(conn)
        if data.tasks is not None:
            await self._reconcile_held(conn, set(data.tasks))
        log.info(
            "bridge %s: registered, %d/%d free",
            bridge_id,
            conn.free(),
            data.instance_count,
            extra=ctx(bridge=bridge_id),
        )
        self.health.poke()  # the first bridge ever makes internal capacity usable at once
        self.wake()

    async def _reconcile_held(self, conn: BridgeConn, listed: set[str]) -> None:
        """Requeue acknowledged tasks the bridge no longer lists (fenced by attempt)."""
        ttl = int(self.rt.settings.task_deadline_s) + 60
        for task_id, attempt in (await self.registry.take_held(conn.bridge_id)).items():
            if task_id in listed:
                await self.registry.remember(conn.bridge_id, task_id, attempt, ttl)
                conn.running.add(task_id)
                continue
            conn.running.discard(task_id)
            log.warning(
                "bridge %s: task %s no longer held, requeued",
                conn.bridge_id,
                task_id,
                extra=ctx(task=task_id, bridge=conn.bridge_id),
            )
            await self.rt.store.requeue(
                task_id, attempt=attempt, front=True, reason=f"bridge {conn.bridge_id} lost it"
            )

    async def _heartbeat(self, conn: BridgeConn, data: HeartbeatData) -> None:
        before = conn.free()
        conn.reconcile(data.instance_count, data.available_instance_count)
        cooled = time.monotonic() - (conn.quarantined_at or 0.0) >= self._quarantine_s
        probation: int | None = None
        if conn.quarantined_at is not None and cooled and data.available_instance_count > 0:
            probation = conn.failures = self.rt.settings.bridge_failure_limit - 1
            self._readmit(conn, "heartbeat with free instances after cool-down")
        await self._save(conn, failures=probation)
        log.debug(
            "bridge %s: heartbeat, %d free",
            conn.bridge_id,
            conn.free(),
            extra=ctx(bridge=conn.bridge_id),
        )
        if conn.free() > before:
            self.wake()

    async def _ack(self, session: _Session, conn: BridgeConn, data: TaskAckData) -> None:
        task_id = data.data.task_id
        pending = conn.pending.pop(task_id, None)
        if pending is None:
            if task_id in conn.ended_early:  # finished already: nothing left to do
                conn.ended_early.discard(task_id)
                return
            await _error(session, "UnknownTask", f"task {task_id!r} is not awaiting an ACK")
            return
        if pending.timer is not None:
            pending.timer.cancel()
        if data.code == ACK_OK:
            await self._acked(conn, task_id, pending)
        else:
            # The slot stays taken until the next HEARTBEAT says otherwise: a bridge that
            # refused (no instance free, say) would be handed the same task again at once.
            reason = f"bridge {conn.bridge_id} refused: {data.code} {data.msg}"
            await self._requeue(task_id, pending.attempt, reason)
            self.wake()

    async def _acked(self, conn: BridgeConn, task_id: str, pending: Assignment) -> None:
        deadline_s = self.rt.deadline_s(self.rt.config.account(pending.aigc, pending.platform))
        conn.running.add(task_id)  # already: its TASK_END may arrive while we write this
        ok = await self.rt.store.mark_running(
            task_id,
            pending.attempt,
            task_id,
            deadline_s=deadline_s,
            kind="callback",
            progress=progress_event(pending.backend_id, running_message(task_id, self.name)),
        )
        if not ok:
            conn.running.discard(task_id)
        else:
            await self.registry.remember(
                conn.bridge_id, task_id, pending.attempt, int(deadline_s) + 60
            )
        log.info(
            "bridge %s: task %s acknowledged (running=%s)",
            conn.bridge_id,
            task_id,
            ok,
            extra=ctx(task=task_id, bridge=conn.bridge_id),
        )

    # ---- assignment ---------------------------------------------------------------------

    async def _send_assign(self, conn: BridgeConn, aigc: str, platform: str, c: Claimed) -> None:
        try:
            msg = self._assign_message(c)
        except ValidationError as exc:
            await self._reject(c, str(exc))
            return
        pending = Assignment(c.attempt, aigc, platform, c.backend_id)
        conn.available -= 1
        conn.pending[c.task_id] = pending
        pending.timer = asyncio.get_running_loop().call_later(
            self.config.ack_timeout_s, self._spawn_ack_timeout, conn, c.task_id
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
            await self._lost(conn, "send failed")
            return
        log.info(
            "bridge %s: task %s assigned (attempt %d)",
            conn.bridge_id,
            c.task_id,
            c.attempt,
            extra=ctx(task=c.task_id, bridge=conn.bridge_id),
        )

    def _assign_message(self, c: Claimed) -> TaskAssignMessage:
        hook = self.rt.webhook_url(c.task_id, c.attempt)
        data = TaskAssignData.model_validate(
            {
                "taskId": c.task_id,
                "attempt": c.attempt,
                "workflowId": c.workflow_id or None,
                "nodeInfoList": c.payload.get("nodeInfoList") or [],
                "webhookUrl": hook,
                "workflow": c.payload.get("workflow"),
            }
        )
        return TaskAssignMessage(data=data)

    async def _reject(self, c: Claimed, reason: str) -> None:
        """A payload no bridge can run: the task fails for its client."""
        error = {"code": "InvalidPayload", "message": "not a valid bridge task", "detail": reason}
        await self.rt.store.finish(
            c.task_id,
            TaskState.FAILED,
            error=error,
            message=self.outcomes.error_body(ErrorCode.TASK_FAILED, error),
            note="bridge: invalid payload",
        )
        log.warning(
            "task %s: not assignable to a bridge: %s", c.task_id, reason, extra=ctx(task=c.task_id)
        )

    def _spawn_ack_timeout(self, conn: BridgeConn, task_id: str) -> None:
        self._spawn(self._ack_timeout(conn, task_id))

    async def _ack_timeout(self, conn: BridgeConn, task_id: str) -> None:
        pending = conn.pending.pop(task_id, None)
        if pending is not None:
            reason = f"bridge {conn.bridge_id}: no TASK_ACK"
            log.warning(
                "bridge %s: task %s not acknowledged in time",
                conn.bridge_id,
                task_id,
                extra=ctx(task=task_id, bridge=conn.bridge_id),
            )
            await self._release(conn, task_id, pending, reason)

    async def _release(
        self, conn: BridgeConn, task_id: str, pending: Assignment, reason: str
    ) -> None:
        """Give back an unacknowledged task's slot and put the task back at the head."""
        conn.available += 1
        await self._requeue(task_id, pending.attempt, reason)
        self.wake()

    async def _requeue(self, task_id: str, attempt: int, reason: str) -> None:
        await self.rt.store.requeue(
            task_id, attempt=attempt, uncharge=True, front=True, reason=reason
        )
        log.info("task %s: back to waiting (%s)", task_id, reason, extra=ctx(task=task_id))

    async def hand_back(self, reason: str = "aigcq shutting down") -> list[str]:
        """Graceful shutdown: every task assigned here and not yet acknowledged goes back to
        the head of its queue, uncharged (a bridge's late TASK_ACK is then ignored)."""
        handed: list[str] = []
        for conn in list(self.registry.bridges.values()):
            pending, conn.pending = conn.pending, {}
            for task_id, p in pending.items():
                if p.timer is not None:
                    p.timer.cancel()
                conn.available += 1
                await self._requeue(task_id, p.attempt, f"bridge {conn.bridge_id}: {reason}")
                handed.append(task_id)
        return handed

    # ---- failing bridges -----------------------------------------------------------------

    @property
    def _quarantine_s(self) -> float:
        return self.rt.settings.bridge_quarantine_s

    def task_ended(self, task_id: str, target: str, ok: bool) -> None:
        """TASK_END hook: the slot is free again; consecutive failures take a bridge out of
        rotation, a success re-admits it. A bridge is also re-admitted by its first
        HEARTBEAT with free instances after ``bridge_quarantine_s``, on probation: one more
        failure and it is out again.

        The count is the bridge's, in Redis, whichever process receives the TASK_END; the
        process holding the bridge's connection applies it (see :meth:`_save`)."""
        if target != self.name:
            return
        conn = next((b for b in self.registry.live() if _holds(b, task_id)), None)
        if conn is not None:
            _forget(conn, task_id)
            if ok:
                self._free_slot(conn)
        self._spawn(self._count_end(task_id, ok, conn))

    def _free_slot(self, conn: BridgeConn) -> None:
        # The instance is free again now, not at the bridge's next HEARTBEAT (up to 30 s
        # away): without this, finished GPUs would look busy and tasks would overflow.
        # A HEARTBEAT sent after the task ended but handled before its TASK_END (HTTP and
        # the socket race) has already counted this slot free: never count more free slots
        # than the tasks we know to be on the bridge leave.
        ours = conn.instance_count - len(conn.running) - len(conn.pending)
        conn.available = min(conn.available + 1, ours)
        self.wake()

    async def _count_end(self, task_id: str, ok: bool, conn: BridgeConn | None) -> None:
        try:
            counted = await self.registry.count_end(task_id, ok, conn.bridge_id if conn else "")
        except Exception as exc:  # Redis away: the next TASK_END counts again
            log.warning(
                "task %s: bridge failure count not updated: %r",
                task_id,
                exc,
                extra=ctx(task=task_id, bridge=conn.bridge_id if conn else None),
            )
            counted = None
        if conn is not None and not ok:  # freed only now: a failing bridge is out first
            self._free_slot(conn)
        if counted is None:
            return
        bridge_id, failures = counted
        owner = self.registry.bridges.get(bridge_id)
        if owner is None:  # another process holds the bridge: its slot is free now
            end = {"bridgeId": bridge_id, "taskId": task_id, "failures": failures}
            await self.rt.store.mux.command(
                "PUBLISH", self.rt.store.keys.events, bridge_end_event(end)
            )
        elif self._apply_failures(owner, failures, task_id):
            await self.registry.save(owner)

    def remote_task_end(self, end: dict[str, Any]) -> None:
        """A TASK_END that another process received, for a bridge connected here: free
        the slot now rather than at the bridge's next HEARTBEAT (up to 30 s away), and
        apply the bridge's failure count first (a failing bridge is out before reuse)."""
        conn = self.registry.bridges.get(str(end.get("bridgeId")))
        task_id = str(end.get("taskId"))
        if conn is None or not _holds(conn, task_id):
            return
        _forget(conn, task_id)
        if self._apply_failures(conn, int(end.get("failures", 0)), task_id):
            self._spawn(self._save(conn))
        self._free_slot(conn)

    async def _save(self, conn: BridgeConn, *, failures: int | None = None) -> None:
        """Save ``conn`` (setting its shared failure count to ``failures``, if given) and
        apply the shared count, which TASK_ENDs received by other processes change."""
        shared = await self.registry.save(conn, failures=failures)
        if conn.online and self._apply_failures(conn, shared, None):
            await self.registry.save(conn)

    def _apply_failures(self, conn: BridgeConn, failures: int, task_id: str | None) -> bool:
        """Quarantine at ``bridge_failure_limit`` failures in a row, re-admit below it (a
        success resets the count); ``True`` if that changed the bridge's rotation."""
        conn.failures = failures
        limit = self.rt.settings.bridge_failure_limit
        if conn.quarantined_at is None and failures >= limit:
            conn.quarantined_at = time.monotonic()
            log.warning(
                "bridge %s: out of rotation after %d failed tasks in a row (last: task %s)",
                conn.bridge_id,
                conn.failures,
                task_id or "?",
                extra=ctx(task=task_id, bridge=conn.bridge_id),
            )
            self.health.poke()
            return True
        if conn.quarantined_at is not None and failures < limit:
            self._readmit(conn, f"task {task_id or '?'} succeeded")
            return True
        return False

    def _readmit(self, conn: BridgeConn, why: str) -> None:
        conn.quarantined_at = None
        log.warning(
            "bridge %s: back in rotation (%s)",
            conn.bridge_id,
            why,
            extra=ctx(bridge=conn.bridge_id),
        )
        self.wake()

    # ---- losing a bridge ----------------------------------------------------------------

    async def _keepalive(self, session: _Session, conn: BridgeConn) -> None:
        """PING periodically; declare the bridge lost after too many silent intervals."""
        cfg = self.config
        silence = cfg.heartbeat_interval_s * cfg.missed_heartbeats
        tick = min(cfg.ping_interval_s, cfg.heartbeat_interval_s)
        next_ping = time.monotonic() + cfg.ping_interval_s
        while conn.online:
            await asyncio.sleep(tick)
            if time.monotonic() - conn.last_seen > silence:
                await self._lost(conn, "missed heartbeats")
                await session.ws.close(CLOSE_TIMEOUT, "missed heartbeats")
                return
            if time.monotonic() >= next_ping:
                next_ping += cfg.ping_interval_s
                await session.send(encode(PingMessage()))

    async def _lost(self, conn: BridgeConn, reason: str, *, check: bool = True) -> None:
        """Offline: stop sending; unacknowledged tasks go back to waiting at once.

        ``check``: run a health check at once (not when the bridge is reconnecting).
        """
        if not conn.online:
            return
        conn.online = False
        if self.registry.bridges.get(conn.bridge_id) is conn:
            del self.registry.bridges[conn.bridge_id]
        if check:
            self.health.poke()
        pending, conn.pending = conn.pending, {}
        log.warning(
            "bridge %s: offline (%s), %d unacked",
            conn.bridge_id,
            reason,
            len(pending),
            extra=ctx(bridge=conn.bridge_id),
        )
        for p in pending.values():
            if p.timer is not None:
                p.timer.cancel()
        try:
            for task_id, p in pending.items():
                await self._requeue(task_id, p.attempt, f"bridge {conn.bridge_id} lost: {reason}")
            await self.registry.save(conn)
        except REDIS_OUTAGE as exc:
            # what is not requeued now is settled by its task deadline
            log.warning(
                "bridge %s: offline not recorded, Redis unavailable (%s)",
                conn.bridge_id,
                exc,
                extra=ctx(bridge=conn.bridge_id),
            )
        if pending:
            self.wake()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _holds(conn: BridgeConn, task_id: str) -> bool:
    return task_id in conn.running or task_id in conn.pending


def _forget(conn: BridgeConn, task_id: str) -> None:
    """The task's TASK_END came: it no longer runs on ``conn``. Its TASK_ACK may not have
    (HTTP can overtake the socket): that late ACK is then dropped quietly."""
    conn.running.discard(task_id)
    early = conn.pending.pop(task_id, None)
    if early is not None:
        if early.timer is not None:
            early.timer.cancel()
        conn.ended_early.add(task_id)


async def _error(session: _Session, code: str, msg: str) -> None:
    await session.send(encode(ErrorMessage(data=ErrorData(code=code, msg=msg))))


def _bid(session: _Session) -> str:
    return session.conn.bridge_id if session.conn else "-"


def _ctx(session: _Session) -> dict[str, str]:
    return ctx(bridge=session.conn.bridge_id if session.conn else None)
