"""The bridges' health check and the seed's ``md:state:*`` keys (seed 000 §8.3).

In the all-in-one topology a check passes when at least one bridge is connected, in
rotation, heard from (REGISTER/HEARTBEAT) within ``bridge_silence_s`` and has instances.
The process starts healthy (nothing has failed yet) and checks every
``health_interval_s``; the hub calls :meth:`HealthMonitor.poke` when a bridge is lost or
taken out of rotation, which degrades at once when the check now fails, and when a bridge
registers. A poke counts as a pass only for the first pass ever, or when the bridge that
registered is in good standing (new, or back after its socket closed, or moved from another
process, as the cluster-wide record says: :mod:`.known`): its capacity has not failed, so
it is usable at once. A bridge that went silent or is out of rotation cannot shorten a
recovery that way.

State is published under the seed's keys (no project prefix): ``md:state:connection``,
``md:state:capacity`` (60 s TTL), ``md:state:last_heartbeat`` (epoch ms, 60 s TTL),
``md:state:instances`` and ``md:state:instances:{instanceId}`` (60 s TTL: id, bridge,
status online/busy/offline, current task and since when; a seed bridge that reports counts
only has its instances named ``{bridgeId}-{n}``, :func:`counted_instances`), plus
``md:state:health`` (status, reason, passes, degradeCount, recoverCount) where the seed only
says "set status: degraded". Several processes on one Redis each write their own view.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from datetime import UTC, datetime
from typing import Any

import orjson
from redis.asyncio import Redis

from aigcq.bridges.registry import BridgeConn
from aigcq.config import Settings
from aigcq.health import NO_BRIDGE, Health, HealthState
from aigcq.plumbing.background import every, round_failed
from aigcq.queue.keys import (
    MD_STATE_CAPACITY,
    MD_STATE_CONNECTION,
    MD_STATE_HEALTH,
    MD_STATE_HEARTBEAT,
    MD_STATE_INSTANCES,
)

log = logging.getLogger(__name__)

STATE_TTL_S = 60


def check_bridges(bridges: Iterable[BridgeConn], now: float, silence_s: float) -> str:
    """Why the bridges give no usable internal capacity; ``""`` when they do (seed §8.3.1)."""
    live = [b for b in bridges if b.online]
    if not live:
        return NO_BRIDGE
    heard = [b for b in live if now - b.last_seen <= silence_s]
    if not heard:
        return f"no heartbeat within {silence_s:g} s"
    if not any(b.instance_count > 0 for b in heard):
        return "no instances"
    if all(b.quarantined_at is not None for b in heard if b.instance_count > 0):
        return "every bridge is out of rotation"
    return ""


class HealthMonitor:
    """Runs the checks, keeps :class:`Health`, publishes ``md:state:*``, logs and counts."""

    def __init__(
        self,
        redis: Redis,
        bridges: Callable[[], Iterable[BridgeConn]],
        settings: Settings,
        *,
        on_change: Callable[[], None] = lambda: None,
        speaks: Callable[[], bool] = lambda: True,
    ) -> None:
        self.redis = redis
        self.bridges = bridges
        self.interval_s = settings.health_interval_s
        self.silence_s = settings.bridge_silence_s
        self.on_change = on_change
        self.health = Health(recover_passes=settings.health_recover_passes)
        #: whether this process writes md:state:* (False: another process has the bridges)
        self.speaks = speaks
        self._connected_at = ""
        self._disconnected_at = ""
        #: (instance id, task id) -> when it was first seen running that task
        self._task_since: dict[tuple[str, str], str] = {}
        self._instance_ids: set[str] = set()  # the instances we last wrote
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    async def run(self) -> None:
        await every(self.interval_s, self.check, log, "health check failed to run")

    async def check(self) -> None:
        """One periodic check: a pass counts towards recovery."""
        self._observe(self._reason())
        await self.publish()

    def poke(self, *, fresh: bool = False) -> None:
        """Check now, after a bridge registered or was lost: a failure is recorded, a pass
        only when it is the first ever or ``fresh`` (a bridge in good standing registered,
        see :meth:`Health.observe`)."""
        reason = self._reason()
        if reason or not self.health.proven or fresh:
            self._observe(reason, fresh=fresh)
        self._spawn(self.publish())

    def _reason(self) -> str:
        return check_bridges(self.bridges(), time.monotonic(), self.silence_s)

    def _observe(self, reason: str, *, fresh: bool = False) -> None:
        h = self.health
        was, before = h.reason, h.state
        changed = h.observe(reason, fresh=fresh)
        if changed is HealthState.DEGRADED and before is HealthState.RECOVERING:
            log.warning("internal capacity recovery interrupted (%s)", reason)
        elif changed is HealthState.DEGRADED:
            log.warning("internal capacity degraded (%s), degrade #%d", reason, h.degrades)
        elif changed is HealthState.RECOVERING:
            log.info("internal capacity recovering (1/%d passes, was: %s)", h.recover_passes, was)
        elif changed is HealthState.HEALTHY:
            log.warning("internal capacity recovered (was: %s), recover #%d", was, h.recovers)
        if changed is not None:
            self.on_change()

    async def publish(self) -> None:
        """Write the seed's ``md:state:*`` keys from the bridges and the health state."""
        if not self.speaks():
            return
        bridges = [b for b in self.bridges() if b.online]
        now = _iso()
        if bridges and not self._connected_at:
            self._connected_at, self._disconnected_at = now, ""
        elif not bridges and self._connected_at:
            self._connected_at, self._disconnected_at = "", now
        total = sum(b.instance_count for b in bridges)
        online = sum(b.instance_count for b in bridges if b.quarantined_at is None)
        free = sum(b.free() for b in bridges)
        h = self.health
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(
            MD_STATE_CONNECTION,
            mapping={
                "status": "connected" if bridges else "disconnected",
                "connectedAt": self._connected_at,
                "disconnectedAt": self._disconnected_at,
                "disconnectReason": h.reason if not bridges else "",
                "reconnectAttempts": 0,  # bridges dial us; we never reconnect
            },
        )
        pipe.hset(
            MD_STATE_CAPACITY,
            mapping={
                "totalBridges": len(bridges),
                "totalInstances": total,
                "onlineInstances": online,
                "busyInstances": max(online - free, 0),
                "availableCapacity": free,
                "updatedAt": now,
            },
        )
        pipe.expire(MD_STATE_CAPACITY, STATE_TTL_S)
        if bridges:
            last = max(b.last_seen for b in bridges)
            wall_ms = int((time.time() - (time.monotonic() - last)) * 1000)
            pipe.set(MD_STATE_HEARTBEAT, wall_ms, ex=STATE_TTL_S)
        self._instances(pipe, bridges, now)
        pipe.hset(
            MD_STATE_HEALTH,
            mapping={
                "status": h.state.value,
                "reason": h.reason,
                "passes": h.passes,
                "degradeCount": h.degrades,
                "recoverCount": h.recovers,
                "updatedAt": now,
            },
        )
        await pipe.execute()

    def _instances(self, pipe: Any, bridges: list[BridgeConn], now: str) -> None:
        """``md:state:instances[:{id}]`` for every instance the bridges describe."""
        states = instance_states(bridges, self._task_since, now)
        self._task_since = {
            (s["instanceId"], s["currentTaskId"]): s["currentTaskStartTime"]
            for s in states
            if s["currentTaskId"]
        }
        gone = self._instance_ids - {s["instanceId"] for s in states}
        self._instance_ids = {s["instanceId"] for s in states}
        if gone:  # ours no more (other processes' bridges keep theirs)
            pipe.hdel(MD_STATE_INSTANCES, *gone)
        for state in states:
            key = f"{MD_STATE_INSTANCES}:{state['instanceId']}"
            pipe.hset(key, mapping=state)
            pipe.expire(key, STATE_TTL_S)
            pipe.hset(MD_STATE_INSTANCES, state["instanceId"], orjson.dumps(state))
        pipe.expire(MD_STATE_INSTANCES, STATE_TTL_S)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(_logged(coro))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)


async def _logged(coro: Coroutine[Any, Any, None]) -> None:
    try:
        await coro
    except Exception as exc:
        round_failed(log, "publishing health state failed", exc)


def counted_instances(bridge: BridgeConn) -> list[dict[str, Any]]:
    """A bridge that reports counts only (the seed's REGISTER, no per-instance list): its
    instances as ``{bridgeId}-{n}``, the ones in use first (each with one of its tasks,
    while there are some), the free ones idle (offline while the bridge is)."""
    tasks = sorted(bridge.running)
    in_use = bridge.instance_count - bridge.slots.free
    free_state = "idle" if bridge.online else "offline"
    return [
        {
            "instanceId": f"{bridge.bridge_id}-{n}",
            "state": "busy" if n <= in_use else free_state,
            "taskId": tasks[n - 1] if n <= min(in_use, len(tasks)) else None,
        }
        for n in range(1, bridge.instance_count + 1)
    ]


def instance_states(
    bridges: Iterable[BridgeConn], since: dict[tuple[str, str], str], now: str
) -> list[dict[str, str]]:
    """Seed 000's instance record for each instance the bridges describe: ``status``
    online (idle), busy or offline; ``currentTaskStartTime`` when it was first seen
    running its task (``since``, else ``now``); empty strings for the seed's nulls."""
    out = []
    for b in bridges:
        for i in b.instance_states or counted_instances(b):
            task = str(i.get("taskId") or "")
            status = {"idle": "online"}.get(str(i["state"]), str(i["state"]))
            out.append(
                {
                    "instanceId": str(i["instanceId"]),
                    "bridgeId": b.bridge_id,
                    "status": status,
                    "currentTaskId": task,
                    "currentTaskStartTime": since.get((str(i["instanceId"]), task), now)
                    if task
                    else "",
                    "lastUpdated": now,
                }
            )
    return out


def _iso() -> str:
    """The seed's timestamp format, e.g. ``2024-01-01T00:00:00.000Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
