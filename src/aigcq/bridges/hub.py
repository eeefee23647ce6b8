"""The bridge hub: bridges connect to ``/ws``, we assign them tasks (an ``InternalTarget``).

The socket and its messages are here; slots are :mod:`.slots`', handing out tasks (and
what their TASK_ACK says) :mod:`.assigner`'s, a task's end :mod:`.endings`', rotation
:mod:`.rotation`'s. Bad input gets an ``ERROR`` frame and changes nothing; a bad token
closes with 4401, a flood with 4008.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from aigcq.bridges.assigner import Assigner
from aigcq.bridges.endings import TaskEnds
from aigcq.bridges.health_monitor import HealthMonitor
from aigcq.bridges.known import CLOSED, SILENT, Standing
from aigcq.bridges.peer_offers import Offered, PeerOffers
from aigcq.bridges.peers import PeerCapacity
from aigcq.bridges.progress import ProgressRelay
from aigcq.bridges.registry import BridgeConn, BridgeRegistry
from aigcq.bridges.rotation import Rotation
from aigcq.bridges.session import (
    CLOSE_AUTH,
    CLOSE_FLOOD,
    CLOSE_REGISTER_TIMEOUT,
    CLOSE_TIMEOUT,
    HubConfig,
    Rate,
    Session,
)
from aigcq.domain import LIVE_STATES
from aigcq.health import Health
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.auth import Auth, bearer
from aigcq.plumbing.background import REDIS_OUTAGE
from aigcq.plumbing.ws_frames import receive_frame
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.ends import TaskEnd
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.targets import Chosen, HandBack
from aigcq.wire.bridge import (
    BridgeMessage,
    CapacityData,
    CapacityMessage,
    HeartbeatData,
    HeartbeatMessage,
    PingMessage,
    PongMessage,
    ProtocolError,
    RegisterData,
    RegisterMessage,
    TaskAckMessage,
    TaskProgressMessage,
    parse_bridge_message,
)

__all__ = ["CLOSE_AUTH", "CLOSE_FLOOD", "CLOSE_TIMEOUT", "BridgeHub", "HubConfig"]

log = logging.getLogger(__name__)
#: how long a slot whose instance is stopping a prompt counts as about to be free (ComfyUI
#: lets a prompt go within about a second; a bridge that never says so is not waited for)
STOPPING_SOON_S = 10.0


class BridgeHub:
    """Bridges connected to this process: the dispatch loop's internal target (see
    :mod:`aigcq.scheduler.targets`)."""

    name = "bridge"
    serves: tuple[str, ...] = ("comfyui",)
    preferred = True

    def __init__(
        self,
        rt: Runtime,
        lifecycle: Lifecycle,
        *,
        wake: Callable[[], None] = lambda: None,
        config: HubConfig | None = None,
    ) -> None:
        self.rt = rt
        self.lifecycle = lifecycle
        self.config = config or HubConfig()
        self.auth = Auth(rt.settings)
        ttl = int(self.config.heartbeat_interval_s * self.config.missed_heartbeats * 4)
        self.registry = BridgeRegistry(rt.store, rt.settings.project_prefix, ttl_s=ttl)

        # what the others wait for rather than pay: our free slots, those whose instance is
        # stopping a cancelled prompt (free within about a second), and a bridge that left
        # within its grace (see :mod:`.peer_offers`)
        def mine() -> tuple[int, int]:
            soon = self.stopping_here() + self.offers.departed_here()
            return self.free_slots() + soon, len(self.registry.live())

        keys = rt.store.keys
        self.peers = PeerCapacity(
            rt.redis, keys.internal_free, mine, on_less=wake, channel=keys.events
        )
        self._wake_dispatch = wake
        self.registry.process_id = self.peers.process_id  # its records name this process
        self.offers = PeerOffers(
            rt.redis,
            keys.internal_offers,
            self.peers.process_id,
            self.registry.offered,
            lambda: self.peers.holding,
        )
        self.registry.on_offers = self.offers.changed
        self.peers.on_holding = self.offers.changed
        self.health = HealthMonitor(
            rt.redis,
            self.registry.live,
            rt.settings,
            on_change=self.wake,
            # md:state:* describes the fleet: a process with no bridge leaves it to one with some
            speaks=lambda: bool(self.registry.live()) or not self.peers.bridges_elsewhere,
        )
        self.rotation = Rotation(rt, self.registry, self.health, self.wake)
        self.ends = TaskEnds(
            rt,
            self.name,
            self.registry,
            self.rotation,
            self.wake,
            freed_elsewhere=self.peers.expect,
            bridges_elsewhere=lambda: bool(self.peers.bridges_elsewhere),
            released=lifecycle.released,
            published=self.peers.write,
            me=self.peers.process_id,
        )
        self.assigner = Assigner(
            rt,
            lifecycle,
            self.registry,
            self.ends,
            name=self.name,
            config=lambda: self.config,
            wake=self.wake,
            lost=self._lost,
            elsewhere=self.offers.reach,
            unknown=lambda needs: self.offers.unknown_classes(needs, self.registry.offered()),
        )
        self.progress = ProgressRelay(rt)

    def wake(self) -> None:
        """Our slots changed: dispatch now, and tell the other processes."""
        self._wake_dispatch()
        self.peers.changed()

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
        """Slots tasks wait for rather than overflow to a paid platform: free slots on
        bridges connected to other processes (see :mod:`.peers`), slots here whose
        instance is stopping a cancelled prompt (free within about a second), and the
        slots of bridges that left within their grace (a restart, see :mod:`.peer_offers`)."""
        return self.peers.free + self.stopping_here() + self.offers.departed_here()

    async def fresh_elsewhere(self) -> int:
        """:meth:`free_elsewhere`, the other processes' entries read again now (when any
        of them holds bridges; Redis away: as last read)."""
        if self.peers.holding:
            try:
                await self.peers.read()
            except REDIS_OUTAGE as exc:
                log.info("internal capacity of other processes not read again: %r", exc)
        return self.free_elsewhere()

    def stopping_here(self) -> int:
        """Slots of bridges here in rotation whose instance is stopping a prompt we no
        longer want (none while health is not ``healthy``): busy now, free when the bridge
        says so, within about a second. They count as free elsewhere for every process
        (published with our free slots, :mod:`.peers`): a task that one of them frees
        for waits for it on any process, not on a paid platform. Only for
        :data:`STOPPING_SOON_S` after the stop: one stopping longer is not promised."""
        if not self.health.healthy:
            return 0
        live = self.registry.live()
        turning = (c for c in live if c.quarantined_at is None and not c.drained)
        return sum(c.slots.stopping_soon(STOPPING_SOON_S) for c in turning)

    async def slot_freed_later(self, task_id: str, target: str, attempt: int) -> bool:
        """Whether the slot ``attempt`` of ``task_id`` took is on a bridge, here or held by
        another process, that is freed after the task's retry is queued: the process
        holding it frees it when it hears of the end, writes its free slots for the
        others, and only then makes the retry dispatchable (see :mod:`.endings`)."""
        if target != self.name:
            return False
        if any(c.slots.attempt_of(task_id) == attempt for c in self.registry.holders(task_id)):
            return True
        return await self.registry.held_elsewhere(task_id, attempt)

    async def run(self) -> None:
        await asyncio.gather(self.health.run(), self.peers.run(), self.offers.run())

    async def choose(
        self,
        aigc: str,
        platform: str,
        n: int,
        *,
        paid_free: int | None,
        among: Sequence[str] | None = None,
    ) -> Chosen | None:
        if not self.health.healthy:  # it takes nothing: tasks overflow as planned
            return None
        return await self.assigner.choose(aigc, platform, n, paid_free=paid_free, among=among)

    async def hand_over(self, aigc: str, platform: str, tasks: list[Claimed]) -> list[HandBack]:
        return await self.assigner.assign(aigc, platform, tasks)

    async def hand_back(self, reason: str = "aigcq shutting down") -> list[str]:
        return await self.assigner.hand_back(reason)

    async def drain(self, bridge_id: str, drained: bool) -> bool:
        """Stop (or resume) assigning to ``bridge_id`` here; ``False`` if it is not connected
        here (then it takes effect when it connects). An operator's drain is a pause
        (:mod:`aigcq.scheduler.pauses`): every process applies it (:meth:`apply_drains`)."""
        conn = self.registry.set_drained(bridge_id, drained)
        if conn is None:
            return False
        log.info(
            "bridge %s: %s",
            bridge_id,
            "drained" if drained else "undrained",
            extra=ctx(bridge=bridge_id),
        )
        await self.rotation.save(conn)
        if not drained:
            self.wake()
        return True

    async def apply_drains(self, drained: frozenset[str]) -> None:
        """The bridges an operator paused now (read from Redis by the dispatch loop):
        drain those newly in it, undrain those no longer in it."""
        for bridge_id in sorted(drained ^ self.registry.drained):
            await self.drain(bridge_id, bridge_id in drained)

    # ---- the WebSocket endpoint ---------------------------------------------------------

    async def endpoint(self, ws: WebSocket) -> None:
        """``/ws``: token in ``?token=``, ``Authorization: Bearer`` or REGISTER ``data.token``."""
        await ws.accept()
        token = ws.query_params.get("token") or bearer(ws.headers.get("authorization"))
        limit = self.rt.settings.bridge_max_msgs_per_s
        session = Session(ws, authed=token is not None, rate=Rate(limit))
        if token is not None and not self.auth.bridge(token):
            await self._refuse(session)
            return
        registered_by = (
            asyncio.get_running_loop().time() + self.rt.settings.bridge_register_timeout_s
        )
        try:
            while (raw := await self._receive(session, registered_by)) is not None:
                if not session.rate.allow():
                    log.warning(
                        "bridge %s: message flood, closing", session.bridge_id, extra=session.ctx()
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
            if session.conn is not None and session.conn.online:  # not silent: a blip
                await self._lost(session.conn, "socket closed")

    async def _receive(self, session: Session, registered_by: float) -> str | bytes | None:
        """The next frame, ``None`` once the socket closed; a bridge that has not
        registered by ``registered_by`` (loop time) is closed with 4408 first."""
        if session.conn is not None:
            return await receive_frame(session.ws)
        try:
            async with asyncio.timeout_at(registered_by):
                return await receive_frame(session.ws)
        except TimeoutError:
            wait = self.rt.settings.bridge_register_timeout_s
            log.warning("bridge connection closed: no REGISTER within %g s", wait)
            why = f"no REGISTER within {wait:g} s of connecting (AIGCQ_BRIDGE_REGISTER_TIMEOUT_S)"
            await session.error("RegisterTimeout", why)
            await session.ws.close(CLOSE_REGISTER_TIMEOUT, "RegisterTimeout")
            return None

    async def _on_frame_or_outage(self, session: Session, raw: str | bytes) -> bool:
        """:meth:`_on_frame`, keeping the bridge connected through a Redis outage: the
        message's effect is lost (what it reported comes again: heartbeats, held tasks on
        REGISTER, TASK_END retried by the bridge), not the connection."""
        try:
            return await self._on_frame(session, raw)
        except REDIS_OUTAGE as exc:
            log.warning(
                "bridge %s: message not handled, Redis unavailable (%s)",
                session.bridge_id,
                exc,
                extra=session.ctx(),
            )
            return True

    async def _on_frame(self, session: Session, raw: str | bytes) -> bool:
        """Handle one frame; ``False`` when the connection was closed."""
        try:
            msg = parse_bridge_message(raw, sender="bridge")
        except ProtocolError as exc:
            if not session.authed:
                await self._refuse(session)
                return False
            log.info("bridge %s: bad message: %s", session.bridge_id, exc, extra=session.ctx())
            await session.send_message(exc.to_message())
            return True
        if not session.authed:
            if not (isinstance(msg, RegisterMessage) and self.auth.bridge(msg.data.token)):
                await self._refuse(session)
                return False
            session.authed = True
        await self._on_message(session, msg)
        return True

    async def _on_message(self, session: Session, msg: BridgeMessage) -> None:
        conn = session.conn
        if conn is not None:
            conn.last_seen = time.monotonic()  # any message is a sign of life
        if isinstance(msg, RegisterMessage):
            await self._register(session, msg.data)
        elif conn is None:
            await session.error("NotRegistered", f"{msg.type} before REGISTER")
        elif isinstance(msg, HeartbeatMessage):
            await self._heartbeat(conn, msg.data)
        elif isinstance(msg, CapacityMessage):
            await self._capacity(conn, msg.data)
        elif isinstance(msg, TaskAckMessage):
            await self.assigner.on_ack(session, conn, msg.data)
        elif isinstance(msg, PongMessage):
            conn.last_pong = time.monotonic()
        elif isinstance(msg, TaskProgressMessage):
            await self.progress.forward(msg.data)

    async def _refuse(self, session: Session) -> None:
        why = self.auth.bridge_refusal()
        log.warning("bridge connection refused: %s", why)
        await session.error("AuthError", why)
        await session.ws.close(CLOSE_AUTH, "AuthError")

    # ---- bridge messages ----------------------------------------------------------------

    async def _register(self, session: Session, data: RegisterData) -> None:
        bridge_id = data.bridge_id
        if session.conn is not None and session.conn.bridge_id != bridge_id:
            await session.error("InvalidMessage", "bridgeId cannot change on a connection")
            return
        old = self.registry.bridges.get(bridge_id)
        if old is not None and old is not session.conn:
            await self._lost(old, "replaced by a new connection", how=None)
        standing = await self._standing(bridge_id)
        conn = session.conn or BridgeConn(bridge_id, session.send)
        conn.reports_capacity = bool(data.capacity_reports)
        conn.capacity_seq = -1  # a new bridge process counts again
        conn.set_state(online=True, drained=bridge_id in self.registry.drained)
        out_since = standing.out_since()
        if out_since is not None and conn.quarantined_at is None:
            # out of rotation on another process (or before): its cool-down goes on
            conn.set_state(quarantined_at=out_since)
        conn.report(data.instance_count, data.available_instance_count)
        conn.describe(data.instances)
        self.registry.bridges[bridge_id] = conn
        session.conn = conn
        await self.offers.back(bridge_id)
        if session.keepalive is None:
            session.keepalive = asyncio.create_task(self._keepalive(session, conn))
        await self.rotation.save(conn)
        if data.tasks is not None:
            await self._reconcile_held(conn, set(data.tasks))
        log.info(
            "bridge %s: registered (%s), %d/%d free",
            bridge_id,
            standing.describe(self.peers.process_id),
            conn.free(),
            data.instance_count,
            extra=ctx(bridge=bridge_id),
        )
        # a bridge in good standing, new or known to any process, is usable at once
        self.health.poke(fresh=standing.fresh)
        self.wake()

    async def _standing(self, bridge_id: str) -> Standing:
        """What the cluster knows of ``bridge_id`` (not known while Redis is away: then it
        counts as new, and its failure count applies at its next save)."""
        try:
            return await self.registry.standing(bridge_id)
        except REDIS_OUTAGE as exc:
            log.warning(
                "bridge %s: its record not read, Redis unavailable (%s)",
                bridge_id,
                exc,
                extra=ctx(bridge=bridge_id),
            )
            return Standing()

    async def _reconcile_held(self, conn: BridgeConn, listed: set[str]) -> None:
        """Keep on ``conn`` the acknowledged tasks it still holds (re-adopted prompts among
        them, their record refreshed in one round trip); requeue those it no longer lists
        (fenced by attempt), each forgotten only once requeued: a restart or a Redis fault
        halfway leaves the rest recorded for the next REGISTER."""
        held = await self.registry.held(conn.bridge_id)
        kept = {t: a for t, a in held.items() if t in listed}
        for task_id, attempt in kept.items():
            conn.adopt(task_id, attempt)
        await self.registry.keep(conn.bridge_id, kept, int(self.rt.settings.task_deadline_s) + 60)
        for task_id, attempt in held.items():
            if task_id not in kept:
                await self._no_longer_held(conn, task_id, attempt)

    async def after_master_change(self) -> None:
        """A new Redis master may lack the last records of what our bridges run: record
        each bridge's acknowledged tasks again (what a re-REGISTER anywhere looks up), and
        name each task whose record is older than its bridge's attempt (its claim was lost:
        its TASK_END, signed for that attempt, still settles it once)."""
        ttl = int(self.rt.settings.task_deadline_s) + 60
        for conn in list(self.registry.bridges.values()):
            running = dict(conn.slots.running)
            await self.registry.keep(conn.bridge_id, running, ttl)
            for task_id, attempt in running.items():
                task = await self.rt.store.reads.head(task_id)
                if task is not None and task.attempt >= attempt and task.state in LIVE_STATES:
                    continue
                log.warning(
                    "task %s: bridge %s runs attempt %d; after the master change Redis has %s",
                    task_id,
                    conn.bridge_id,
                    attempt,
                    f"{task.state} attempt {task.attempt}" if task else "no such task",
                    extra=ctx(task=task_id, bridge=conn.bridge_id),
                )

    async def _no_longer_held(self, conn: BridgeConn, task_id: str, attempt: int) -> None:
        conn.end(task_id)
        await self.lifecycle.lost(task_id, attempt, f"bridge {conn.bridge_id} no longer holds it")
        await self.registry.forget(conn.bridge_id, task_id)

    async def _heartbeat(self, conn: BridgeConn, data: HeartbeatData) -> None:
        before = conn.free()
        gone = conn.report(
            data.instance_count, data.available_instance_count, data.tasks, data.instances
        )
        for task_id in gone:
            log.info(
                "bridge %s: task %s no longer held, its slot is free",
                conn.bridge_id,
                task_id,
                extra=ctx(task=task_id, bridge=conn.bridge_id),
            )
        probation = self.rotation.probation(conn, data.available_instance_count)
        await self.rotation.save(conn, failures=probation)
        log.debug(
            "bridge %s: heartbeat, %d free",
            conn.bridge_id,
            conn.free(),
            extra=ctx(bridge=conn.bridge_id),
        )
        if conn.free() > before:
            self.wake()

    async def _capacity(self, conn: BridgeConn, data: CapacityData) -> None:
        """CAPACITY: an instance's state changed. Applied as a HEARTBEAT is (the same
        method), unless older than one already applied (its ``seq``); a task being stopped
        that it no longer lists frees its slot now."""
        if data.seq <= conn.capacity_seq:
            log.debug(
                "bridge %s: CAPACITY %d dropped (%d applied)",
                conn.bridge_id,
                data.seq,
                conn.capacity_seq,
                extra=ctx(bridge=conn.bridge_id),
            )
            return
        conn.capacity_seq = data.seq
        await self._heartbeat(conn, data)

    # ---- a task's end (see :mod:`.endings`) -------------------------------------------

    def task_ended(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        self.ends.task_ended(task_id, target, end, attempt)

    def remote_task_end(self, end: dict[str, Any]) -> None:
        self.ends.remote_task_end(end)

    # ---- losing a bridge ----------------------------------------------------------------

    async def _keepalive(self, session: Session, conn: BridgeConn) -> None:
        """PING periodically; declare the bridge lost after too many silent intervals."""
        cfg = self.config
        silence = cfg.heartbeat_interval_s * cfg.missed_heartbeats
        tick = min(cfg.ping_interval_s, cfg.heartbeat_interval_s)
        next_ping = time.monotonic() + cfg.ping_interval_s
        while conn.online:
            await asyncio.sleep(tick)
            if time.monotonic() - conn.last_seen > silence:
                await self._lost(conn, "missed heartbeats", how=SILENT)
                await session.ws.close(CLOSE_TIMEOUT, "missed heartbeats")
                return
            if time.monotonic() >= next_ping:
                next_ping += cfg.ping_interval_s
                await session.send_message(PingMessage())

    async def _keep_offers(self, conn: BridgeConn) -> None:
        """A bridge in rotation is leaving: what it offered waits for its return, for its
        grace; written while it still counts here, so no process sees it gone without."""
        if conn.drained or conn.quarantined_at is not None:
            return
        offered = Offered(conn.offers, conn.withdrawn, 1)
        grace_s = self.rt.settings.bridge_grace_s
        try:
            await self.offers.left(conn.bridge_id, offered, conn.instance_count, grace_s)
            self.peers.changed()
        except REDIS_OUTAGE as exc:
            log.warning(
                "bridge %s: its offers not kept, Redis unavailable (%s)",
                conn.bridge_id,
                exc,
                extra=ctx(bridge=conn.bridge_id),
            )

    async def _lost(self, conn: BridgeConn, reason: str, *, how: str | None = CLOSED) -> None:
        """Offline: stop sending; unacknowledged tasks go back to waiting at once; its
        record says how it left (``how``: :data:`~.known.CLOSED` or
        :data:`~.known.SILENT`; ``None``: it is reconnecting here, and no health check
        is run either).
        """
        if not conn.online:
            return
        if how == CLOSED:  # a restart, most often (a silent one is a machine's failure)
            await self._keep_offers(conn)
            if not conn.online:  # let go meanwhile
                return
        if self.registry.bridges.get(conn.bridge_id) is conn:
            del self.registry.bridges[conn.bridge_id]
        conn.set_state(online=False)
        if how is not None:
            self.health.poke()
        pending = conn.release_all()
        log.warning(
            "bridge %s: offline (%s), %d unacked",
            conn.bridge_id,
            reason,
            len(pending),
            extra=ctx(bridge=conn.bridge_id),
        )
        try:
            for task_id, p in pending.items():
                await self.lifecycle.not_run(
                    task_id, p.attempt, f"bridge {conn.bridge_id} lost: {reason}"
                )
            if how is not None:
                await self.registry.leave(conn, how)
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
