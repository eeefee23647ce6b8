"""The capacity feed for queue backends (seed 000 §7), served at ``/ws/capacity``.

A backend connects with the dispatcher JWT (``?token=``, ``Authorization: Bearer`` or
CONNECT ``data.token``), sends CONNECT and gets CONNECT_ACK plus a CAPACITY_UPDATE. Then:
HEARTBEAT → HEARTBEAT_ACK (a backend silent for ``heartbeat + timeout`` is closed),
CAPACITY_UPDATE on every change and at least every ``interval_s``, INSTANCE_ONLINE /
OFFLINE / BUSY / IDLE per instance, and TASK_ALLOCATION from the backend, recorded and
answered with TASK_ALLOCATION_ACK. The summary adds ``healthy`` to the seed's fields.

When the online instances shrink, ``on_shrink(online)`` runs (seed 000 §9.4.1, see
:mod:`aigcq.dispatcher.degrade`); it hands tasks back with :meth:`CapacityFeed.notify`
(``TASK_DEGRADE``) to the backend that allocated them, which answers TASK_DEGRADE_ACK.

Bridges report instance *counts*, not identities, so instances are numbered per bridge
(``{bridgeId}#{n}``) and a task keeps its number while it runs. An instance is ``busy``
with a task assigned to it, or busy with something else when the bridge reports fewer free
instances than it has idle ones; ``offline`` when its bridge is out of rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import WebSocket, WebSocketDisconnect

from aigcq.bridges.hub import CLOSE_AUTH, CLOSE_TIMEOUT, BridgeHub
from aigcq.bridges.registry import BridgeConn
from aigcq.dispatcher.auth import TOKEN_HINT, DispatcherAuth
from aigcq.mdclient.feed_messages import DEGRADE, DEGRADE_ACK, message, now_iso
from aigcq.plumbing.auth import bearer
from aigcq.plumbing.background import round_failed
from aigcq.plumbing.ws_frames import receive_frame

log = logging.getLogger(__name__)

SERVER_ID = "message-dispatcher"
#: most recent TASK_ALLOCATION entries kept
ALLOCATIONS_KEPT = 1000


@dataclass(frozen=True, slots=True)
class FeedConfig:
    interval_s: float = 10.0  # periodic CAPACITY_UPDATE
    change_check_s: float = 0.2  # how often the bridges are compared with the last update
    heartbeat_s: float = 30.0
    heartbeat_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Instance:
    bridge_id: str
    instance_id: str
    status: str  # online | busy | offline
    task_id: str | None = None
    started: str | None = None


class InstanceBook:
    """Numbers each bridge's instances, keeping a task on the same number while it runs."""

    def __init__(self) -> None:
        #: bridgeId -> taskId -> (instance number, start time)
        self._slots: dict[str, dict[str, tuple[int, str]]] = {}

    def instances(self, bridges: list[BridgeConn]) -> list[Instance]:
        self._slots = {b.bridge_id: self._place(b) for b in bridges}
        return [i for b in bridges for i in self._of(b)]

    def _place(self, b: BridgeConn) -> dict[str, tuple[int, str]]:
        tasks = [*b.running, *b.pending]
        kept = {t: s for t, s in self._slots.get(b.bridge_id, {}).items() if t in tasks}
        taken = {n for n, _ in kept.values()}
        unused = (n for n in range(b.instance_count) if n not in taken)
        for task_id in tasks:
            if task_id not in kept and (n := next(unused, None)) is not None:
                kept[task_id] = (n, now_iso())
        return kept

    def _of(self, b: BridgeConn) -> list[Instance]:
        by_slot = {n: (t, at) for t, (n, at) in self._slots[b.bridge_id].items()}
        idle_status = "offline" if b.quarantined_at is not None else "online"
        free = b.free()
        out = []
        for n in range(b.instance_count):
            task_id, started = by_slot.get(n, (None, None))
            if task_id is not None:
                status = "busy"
            elif free > 0 or idle_status == "offline":
                status, free = idle_status, free - 1
            else:
                status = "busy"  # the bridge reports it in use (not by one of our tasks)
            out.append(Instance(b.bridge_id, f"{b.bridge_id}#{n}", status, task_id, started))
        return out


def instance_events(old: dict[str, Instance], new: dict[str, Instance]) -> list[str]:
    """INSTANCE_* messages that take ``old`` to ``new`` (both keyed by instance id)."""
    out = [_offline(i, "disconnected") for k, i in old.items() if k not in new]
    for key, now in new.items():
        out += _changes(old.get(key), now)
    return out


def _changes(before: Instance | None, now: Instance) -> list[str]:
    ids = {"bridgeId": now.bridge_id, "instanceId": now.instance_id}
    if before == now:
        return []
    if now.status == "offline":
        return [_offline(now, "out of rotation")]
    out = []
    if before is None or before.status == "offline":
        out.append(message("INSTANCE_ONLINE", **ids))
    elif before.task_id is not None or before.status == "busy":
        out.append(message("INSTANCE_IDLE", **ids, completedTaskId=before.task_id))
    if now.status == "busy":
        out.append(message("INSTANCE_BUSY", **ids, taskId=now.task_id))
    return out


def _offline(i: Instance, reason: str) -> str:
    ids = {"bridgeId": i.bridge_id, "instanceId": i.instance_id}
    return message("INSTANCE_OFFLINE", **ids, reason=reason)


@dataclass(slots=True, eq=False)
class _Subscriber:
    ws: WebSocket
    client_id: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, *texts: str) -> None:
        async with self.lock:
            for text in texts:
                await self.ws.send_text(text)


@dataclass(eq=False)
class CapacityFeed:
    """The WebSocket endpoint and the loop that pushes capacity to every subscriber."""

    hub: BridgeHub
    auth: DispatcherAuth
    config: FeedConfig = field(default_factory=FeedConfig)
    #: called with the online instance count when it went down (§9.4.1)
    on_shrink: Callable[[int], Awaitable[object]] | None = None
    book: InstanceBook = field(init=False, default_factory=InstanceBook)
    subscribers: set[_Subscriber] = field(init=False, default_factory=set)
    instances: dict[str, Instance] = field(init=False, default_factory=dict)
    connected_at: dict[str, str] = field(init=False, default_factory=dict)
    #: taskId -> {targetInstance, clientId, at}: the backends' TASK_ALLOCATIONs
    allocations: dict[str, dict[str, Any]] = field(init=False, default_factory=dict)
    _online: int | None = field(init=False, default=None)
    _touched: bool = field(init=False, default=False)

    # ---- state --------------------------------------------------------------------------

    def refresh(self) -> list[str]:
        """Re-read the bridges; the INSTANCE_* events since the last refresh."""
        live = self.hub.registry.live()
        for b in live:
            self.connected_at.setdefault(b.bridge_id, now_iso())
        ids = {b.bridge_id for b in live}
        self.connected_at = {k: v for k, v in self.connected_at.items() if k in ids}
        new = {i.instance_id: i for i in self.book.instances(live)}
        events = instance_events(self.instances, new)
        self.instances = new
        return events

    def placed(self) -> dict[str, tuple[str, str, str | None]]:
        """taskId -> (bridgeId, instanceId, startTime) as last refreshed."""
        return {
            i.task_id: (i.bridge_id, i.instance_id, i.started)
            for i in self.instances.values()
            if i.task_id
        }

    def summary(self) -> dict[str, Any]:
        """``availableCapacity`` is what the hub offers: 0 while it is not healthy."""
        statuses = [i.status for i in self.instances.values()]
        return {
            "totalBridges": len(self.connected_at),
            "totalInstances": len(statuses),
            "onlineInstances": len(statuses) - statuses.count("offline"),
            "busyInstances": statuses.count("busy"),
            "availableCapacity": self.hub.free_slots(),
            "healthy": self.hub.healthy,
        }

    def update(self) -> str:
        """CAPACITY_UPDATE of the state last refreshed."""
        bridges: dict[str, list[dict[str, Any]]] = {b: [] for b in self.connected_at}
        for i in self.instances.values():
            task = {"taskId": i.task_id, "startTime": i.started} if i.task_id else None
            bridges[i.bridge_id].append(
                {"instanceId": i.instance_id, "status": i.status, "currentTask": task}
            )
        rows = [
            {"bridgeId": b, "connectedAt": self.connected_at[b], "instances": insts}
            for b, insts in bridges.items()
        ]
        return message("CAPACITY_UPDATE", bridges=rows, summary=self.summary())

    # ---- pushing ------------------------------------------------------------------------

    def touch(self) -> None:
        """A task was accepted. Backends count a slot as taken when they submit; a task
        that starts and ends between two checks leaves the summary as it was, and their
        estimate would stay low until the periodic update, sending tasks to paid
        platforms meanwhile. So the next check pushes an update even if nothing changed."""
        self._touched = True

    async def run(self) -> None:
        """Push on every change (checked every ``change_check_s``), else every ``interval_s``."""
        last: dict[str, Any] = {}
        sent_at = time.monotonic()
        while True:
            await asyncio.sleep(self.config.change_check_s)
            events = self.refresh()
            summary = self.summary()
            due = time.monotonic() - sent_at >= self.config.interval_s
            if events or summary != last or due or self._touched:
                self._touched = False
                await self.broadcast(*events, self.update())
                last, sent_at = summary, time.monotonic()
            await self._check_shrink(summary)

    async def _check_shrink(self, summary: dict[str, Any]) -> None:
        online = int(summary["onlineInstances"]) if summary["healthy"] else 0
        before, self._online = self._online, online
        if before is not None and online < before and self.on_shrink is not None:
            log.warning("instances went from %d to %d", before, online)
            try:
                await self.on_shrink(online)
            except Exception as exc:
                round_failed(log, "handing back tasks after losing instances failed", exc)

    def owner(self, task_id: str) -> str | None:
        """The clientId of the connected backend that allocated ``task_id``, if any."""
        entry = self.allocations.get(task_id)
        client_id = entry.get("clientId") if entry else None
        connected = any(s.client_id == client_id for s in self.subscribers)
        return client_id if connected and isinstance(client_id, str) else None

    async def notify(self, client_id: str, tasks: list[dict[str, Any]], **data: Any) -> bool:
        """TASK_DEGRADE to backend ``client_id``; False when it could not be sent."""
        for sub in list(self.subscribers):
            if sub.client_id == client_id:
                try:
                    await sub.send(message(DEGRADE, tasks=tasks, **data))
                    return True
                except Exception as exc:
                    log.info("capacity feed %s: TASK_DEGRADE not sent: %r", client_id, exc)
                    self.subscribers.discard(sub)
        return False

    async def broadcast(self, *texts: str) -> None:
        for sub in list(self.subscribers):
            try:
                await sub.send(*texts)
            except Exception as exc:  # gone: its endpoint loop cleans up
                log.info("capacity feed %s: send failed: %r", sub.client_id, exc)
                self.subscribers.discard(sub)

    # ---- the endpoint -------------------------------------------------------------------

    async def endpoint(self, ws: WebSocket) -> None:
        await ws.accept()
        token = ws.query_params.get("token") or bearer(ws.headers.get("authorization"))
        try:
            sub = await self._connect(ws, token)
            if sub is None:
                return
            self.subscribers.add(sub)
            await sub.send(message("CONNECT_ACK", serverId=SERVER_ID), self.update())
            log.info("capacity feed: %s connected", sub.client_id)
            await self._serve(sub)
        except (WebSocketDisconnect, TimeoutError):
            pass
        finally:
            self.subscribers = {s for s in self.subscribers if s.ws is not ws}

    async def _connect(self, ws: WebSocket, token: str | None) -> _Subscriber | None:
        """Wait for CONNECT; the subscriber, or ``None`` once refused and closed."""
        frame = await asyncio.wait_for(receive_frame(ws), self.config.connect_timeout_s)
        msg = _parse(frame) if frame is not None else None
        data = msg.get("data") if msg and msg.get("type") == "CONNECT" else None
        if not isinstance(data, dict) or not self.auth.valid(token or data.get("token")):
            log.warning("capacity feed: connection refused (no CONNECT or invalid token)")
            why = f"CONNECT with a valid JWT: {TOKEN_HINT} as data.token or ?token="
            await ws.send_text(message("ERROR", code="AuthError", msg=why))
            await ws.close(CLOSE_AUTH, "AuthError")
            return None
        return _Subscriber(ws, str(data.get("clientId") or "task-queue-backend"))

    async def _serve(self, sub: _Subscriber) -> None:
        silence = self.config.heartbeat_s + self.config.heartbeat_timeout_s
        while True:
            try:
                frame = await asyncio.wait_for(receive_frame(sub.ws), silence)
            except TimeoutError:
                log.warning("capacity feed %s: no heartbeat, closing", sub.client_id)
                with contextlib.suppress(Exception):
                    await sub.ws.close(CLOSE_TIMEOUT, "missed heartbeats")
                return
            if frame is None:
                log.info("capacity feed: %s disconnected", sub.client_id)
                return
            await self._on_message(sub, _parse(frame))

    async def _on_message(self, sub: _Subscriber, msg: dict[str, Any] | None) -> None:
        kind = msg.get("type") if msg else None
        data = msg.get("data") if msg else None
        if kind == "HEARTBEAT":
            await sub.send(message("HEARTBEAT_ACK"))
        elif kind == "TASK_ALLOCATION" and isinstance(data, dict):
            count = self._allocate(sub, data.get("allocatedTasks"))
            await sub.send(message("TASK_ALLOCATION_ACK", accepted=count))
        elif kind == DEGRADE_ACK and isinstance(data, dict):
            accepted = data.get("accepted")
            taken = len(accepted) if isinstance(accepted, list) else 0
            log.info("capacity feed %s: took back %d tasks", sub.client_id, taken)
        else:
            await sub.send(message("ERROR", code="InvalidMessage", msg=f"unexpected {kind!r}"))

    def _allocate(self, sub: _Subscriber, tasks: Any) -> int:
        """Record the well-formed entries of ``allocatedTasks``; how many there were."""
        entries = [
            t for t in tasks or [] if isinstance(t, dict) and isinstance(t.get("taskId"), str)
        ]
        for t in entries:
            self.allocations.pop(t["taskId"], None)
            self.allocations[t["taskId"]] = {
                "targetInstance": t.get("targetInstance"),
                "clientId": sub.client_id,
                "at": now_iso(),
            }
        for stale in list(self.allocations)[: max(0, len(self.allocations) - ALLOCATIONS_KEPT)]:
            del self.allocations[stale]
        log.info("capacity feed %s: %d tasks allocated", sub.client_id, len(entries))
        return len(entries)


def _parse(frame: str | bytes) -> dict[str, Any] | None:
    try:
        msg = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return None
    return msg if isinstance(msg, dict) else None
